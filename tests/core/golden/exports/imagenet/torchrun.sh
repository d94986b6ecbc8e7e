#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
# learning rate 0.2 (linear rule from 0.1 per 256), warmup 12515 steps from 0.1
# lr schedule: linear warmup from 0.1 to 0.2 over 12515 optimizer steps, then constant 0.2
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: 1 sample per epoch is seen twice: DistributedSampler pads 1281167 to 1281168
# warning: the last micro-batch of each epoch holds 9 of 32 samples per replica, so its samples weigh more in that step's gradient
set -euo pipefail
# The job's environment: each node runs this script in a shell of its own (ssh, a
# scheduler), which inherits nothing of yours. Activate it here (or export with the
# setup option), e.g.
#   source /path/to/venv/bin/activate
export GLOBAL_BATCH_SIZE=512 MICRO_BATCH_SIZE=32 GRADIENT_ACCUMULATION_STEPS=1
# Multi-node: run this same script on each of the 2 nodes. The c10d rendezvous
# numbers the nodes as they join; MASTER_ADDR is any one node, the same everywhere.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of one node, the same on every node}"
MASTER_PORT="${MASTER_PORT:-29500}"
torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id "${RDZV_ID:-batchplan}" \
  train.py
