#!/usr/bin/env bash
# batchplan: 8 GPUs, data-parallel size 8
# global batch 256 = micro-batch 8 x accumulation 4 x 8 replicas
# learning rate 0.001 (none rule from 0.001 per 256), warmup 20 steps from 0.0
# lr schedule: linear warmup from 0.0 to 0.001 over 20 optimizer steps, then cosine decay from 0.001 to 0.0001 at the last step (499)
# optimizer adamw, betas (0.9, 0.999), eps 1e-08, weight decay 0.05, gradient clipping at global norm 1.0
# warning: the last micro-batch of each epoch holds 2 of 8 samples per replica, so its samples weigh more in that step's gradient
# warning: an epoch ends mid-accumulation: its last 2 of 782 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 195 counts whole steps): the plan drops them, and every export skips them
# note: no sequence_length in the plan: add --seq-length (and --max-position-embeddings)
# note: Megatron decays neither biases nor 1-D parameters (its default no_weight_decay_cond); the plan decays every parameter: pass no_wd_decay_cond=lambda name, param: False to setup_model_and_optimizer
# Megatron derives data-parallel size 8 = 8 GPUs / (tensor x pipeline x context) = 1.
MEGATRON_ARGS=(
  --micro-batch-size 8
  --global-batch-size 256
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --train-iters 500
  --optimizer adam
  --weight-decay 0.05
  --clip-grad 1.0
  --adam-beta1 0.9
  --adam-beta2 0.999
  --adam-eps 1e-08
  --lr 0.001
  --lr-decay-style cosine
  --min-lr 0.0001
  --lr-decay-iters 499
  --lr-warmup-iters 20
  --lr-warmup-init 0.0
)
# torchrun --nnodes 2 --nproc-per-node 4 <rendezvous> pretrain_gpt.py "${MEGATRON_ARGS[@]}" <model and data arguments>
