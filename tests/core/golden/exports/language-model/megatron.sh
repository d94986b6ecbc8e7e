#!/usr/bin/env bash
# batchplan: 32 GPUs, data-parallel size 16 (model-parallel 2)
# global batch 1024 = micro-batch 2 x accumulation 32 x 16 replicas
# learning rate 0.0006 (sqrt rule from 0.0003 per 1048576 tokens), warmup 99 steps from 6e-06
# lr schedule: linear warmup from 6e-06 to 0.0006 over 99 optimizer steps, then constant 0.0006
# optimizer adamw, betas (0.6000000000000001, 0.996), eps 5e-09, no weight decay, no gradient clipping
# warning: an epoch ends mid-accumulation: its last 4 of 62500 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 1953 counts whole steps): the plan drops them, and every export skips them
# Megatron derives data-parallel size 16 = 32 GPUs / (tensor x pipeline x context) = 2.
MEGATRON_ARGS=(
  --micro-batch-size 2
  --global-batch-size 1024
  --seq-length 4096
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --train-iters 1953
  --calculate-per-token-loss
  --optimizer adam
  --weight-decay 0.0
  --clip-grad 0.0
  --adam-beta1 0.6000000000000001
  --adam-beta2 0.996
  --adam-eps 5e-09
  --lr 0.0006
  --lr-decay-style constant
  --lr-warmup-iters 99
  --lr-warmup-init 6e-06
)
# torchrun --nnodes 4 --nproc-per-node 8 <rendezvous> pretrain_gpt.py "${MEGATRON_ARGS[@]}" <model and data arguments>
