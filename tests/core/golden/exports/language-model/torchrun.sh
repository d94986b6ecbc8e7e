#!/usr/bin/env bash
# batchplan: 32 GPUs, data-parallel size 16 (model-parallel 2)
# global batch 1024 = micro-batch 2 x accumulation 32 x 16 replicas
# learning rate 0.0006 (sqrt rule from 0.0003 per 1048576 tokens), warmup 99 steps from 6e-06
# lr schedule: linear warmup from 6e-06 to 0.0006 over 99 optimizer steps, then constant 0.0006
# optimizer adamw, betas (0.6000000000000001, 0.996), eps 5e-09, no weight decay, no gradient clipping
# warning: an epoch ends mid-accumulation: its last 4 of 62500 micro-steps do not complete an optimizer step (optimizer_steps_per_epoch = 1953 counts whole steps): the plan drops them, and every export skips them
set -euo pipefail
# The job's environment: each node runs this script in a shell of its own (ssh, a
# scheduler), which inherits nothing of yours. Activate it here (or export with the
# setup option), e.g.
#   source /path/to/venv/bin/activate
export GLOBAL_BATCH_SIZE=1024 MICRO_BATCH_SIZE=2 GRADIENT_ACCUMULATION_STEPS=32
# The device mesh: init_device_mesh(device, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES); the sampler's num_replicas/rank are the DATA_PARALLEL_DIMS ones, never the global ones.
export MESH_DIM_NAMES=dp_replicate,tp MESH_SHAPE=16,2 DATA_PARALLEL_DIMS=dp_replicate DATA_PARALLEL_SIZE=16 DATA_PARALLEL_SHARD=1 DATA_PARALLEL_WRAPPER=ddp
# Multi-node: run this same script on each of the 4 nodes. The c10d rendezvous
# numbers the nodes as they join; MASTER_ADDR is any one node, the same everywhere.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of one node, the same on every node}"
MASTER_PORT="${MASTER_PORT:-29500}"
torchrun \
  --nnodes 4 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id "${RDZV_ID:-batchplan}" \
  train.py
