#!/usr/bin/env bash
# batchplan: 8 GPUs, data-parallel size 8
# global batch 256 = micro-batch 8 x accumulation 4 x 8 replicas
# learning rate 0.001 (none rule from 0.001 per 256), warmup 20 steps from 0.0
# lr schedule: linear warmup from 0.0 to 0.001 over 20 optimizer steps, then cosine decay from 0.001 to 0.0001 at the last step (499)
# optimizer adamw, betas (0.9, 0.999), eps 1e-08, weight decay 0.05, gradient clipping at global norm 1.0
# warning: the last micro-batch of each epoch holds 2 of 8 samples per replica, so its samples weigh more in that step's gradient
# warning: an epoch ends mid-accumulation: its last 2 of 782 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 195 counts whole steps): the plan drops them, and every export skips them
set -euo pipefail
# The job's environment: each node runs this script in a shell of its own (ssh, a
# scheduler), which inherits nothing of yours. Activate it here (or export with the
# setup option), e.g.
#   source /path/to/venv/bin/activate
export GLOBAL_BATCH_SIZE=256 MICRO_BATCH_SIZE=8 GRADIENT_ACCUMULATION_STEPS=4
# Multi-node: run this same script on each of the 2 nodes. The c10d rendezvous
# numbers the nodes as they join; MASTER_ADDR is any one node, the same everywhere.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of one node, the same on every node}"
MASTER_PORT="${MASTER_PORT:-29500}"
torchrun \
  --nnodes 2 \
  --nproc-per-node 4 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id "${RDZV_ID:-batchplan}" \
  train.py
