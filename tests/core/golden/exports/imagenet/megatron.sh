#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
# learning rate 0.2 (linear rule from 0.1 per 256), warmup 12515 steps from 0.1
# lr schedule: linear warmup from 0.1 to 0.2 over 12515 optimizer steps, then constant 0.2
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: 1 sample per epoch is seen twice: DistributedSampler pads 1281167 to 1281168
# warning: the last micro-batch of each epoch holds 9 of 32 samples per replica, so its samples weigh more in that step's gradient
# note: no sequence_length in the plan: add --seq-length (and --max-position-embeddings)
# Megatron derives data-parallel size 16 = 16 GPUs / (tensor x pipeline x context) = 1.
MEGATRON_ARGS=(
  --micro-batch-size 32
  --global-batch-size 512
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --train-iters 225270
  --optimizer sgd
  --weight-decay 0.0
  --clip-grad 0.0
  --sgd-momentum 0.9
  --lr 0.2
  --lr-decay-style constant
  --lr-warmup-iters 12515
  --lr-warmup-init 0.1
)
# torchrun --nnodes 2 --nproc-per-node 8 <rendezvous> pretrain_gpt.py "${MEGATRON_ARGS[@]}" <model and data arguments>
