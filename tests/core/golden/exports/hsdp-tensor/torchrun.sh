#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 8 (model-parallel 2)
# global batch 256 = micro-batch 32 x accumulation 1 x 8 replicas
# learning rate 0.1 (linear rule from 0.1 per 256), warmup 10 steps from 0.0
# lr schedule: linear warmup from 0.0 to 0.1 over 10 optimizer steps, then constant 0.1
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: the last micro-batch of each epoch holds 20 of 32 samples per replica, so its samples weigh more in that step's gradient
set -euo pipefail
# The job's environment: each node runs this script in a shell of its own (ssh, a
# scheduler), which inherits nothing of yours. Activate it here (or export with the
# setup option), e.g.
#   source /path/to/venv/bin/activate
export GLOBAL_BATCH_SIZE=256 MICRO_BATCH_SIZE=32 GRADIENT_ACCUMULATION_STEPS=1
# The device mesh: init_device_mesh(device, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES); the sampler's num_replicas/rank are the DATA_PARALLEL_DIMS ones, never the global ones.
export MESH_DIM_NAMES=dp_replicate,dp_shard,tp MESH_SHAPE=2,4,2 DATA_PARALLEL_DIMS=dp_replicate,dp_shard DATA_PARALLEL_SIZE=8 DATA_PARALLEL_SHARD=4 DATA_PARALLEL_WRAPPER=hsdp
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
