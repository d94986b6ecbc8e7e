#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
# note: no sequence_length in the plan: add --seq-length (and --max-position-embeddings)
# Megatron derives data-parallel size 16 = 16 GPUs / (tensor x pipeline x context) = 1.
MEGATRON_ARGS=(
  --micro-batch-size 32
  --global-batch-size 512
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
)
# torchrun --nnodes 2 --nproc-per-node 8 <rendezvous> pretrain_gpt.py "${MEGATRON_ARGS[@]}" <model and data arguments>
