#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
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
