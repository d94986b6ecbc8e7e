#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 8 (model-parallel 2)
# global batch 256 = micro-batch 32 x accumulation 1 x 8 replicas
# learning rate 0.1 (linear rule from 0.1 per 256), warmup 10 steps from 0.0
# lr schedule: linear warmup from 0.0 to 0.1 over 10 optimizer steps, then constant 0.1
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: the last micro-batch of each epoch holds 20 of 32 samples per replica, so its samples weigh more in that step's gradient
# note: no sequence_length in the plan: add --seq-length (and --max-position-embeddings)
# Megatron derives data-parallel size 8 = 16 GPUs / (tensor x pipeline x context) = 2.
MEGATRON_ARGS=(
  --micro-batch-size 32
  --global-batch-size 256
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --train-iters 782
  --optimizer sgd
  --weight-decay 0.0
  --clip-grad 0.0
  --sgd-momentum 0.9
  --lr 0.1
  --lr-decay-style constant
  --lr-warmup-iters 10
  --lr-warmup-init 0.0
)
# torchrun --nnodes 2 --nproc-per-node 8 <rendezvous> pretrain_gpt.py "${MEGATRON_ARGS[@]}" <model and data arguments>
