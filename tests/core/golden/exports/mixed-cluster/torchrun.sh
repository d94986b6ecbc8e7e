#!/usr/bin/env bash
# batchplan: 20 GPUs, data-parallel size 20
# global batch 1000, accumulation 1, uneven micro-batches per replica group:
#   ranks 0-7 (h100): micro-batch 56, loss scale 1.12
#   ranks 8-15 (h100): micro-batch 55, loss scale 1.1
#   ranks 16-19 (a100): micro-batch 28, loss scale 0.56
set -euo pipefail
# The job's environment: each node runs this script in a shell of its own (ssh, a
# scheduler), which inherits nothing of yours. Activate it here (or export with the
# setup option), e.g.
#   source /path/to/venv/bin/activate
# Per-rank micro-batches differ: the training script reads them from its replica table.
# Multi-node with uneven shares: run this script on each of the 3 nodes with
# NODE_RANK set. Ranks are numbered in node-group order, so each node's GPUs get the
# micro-batch planned for them; static rendezvous keeps that order (c10d would number
# nodes as they join).
#   NODE_RANK 0-1: h100 nodes
#   NODE_RANK 2-2: a100 nodes
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the node with NODE_RANK 0}"
: "${NODE_RANK:?set NODE_RANK to this node index, in node-group order}"
MASTER_PORT="${MASTER_PORT:-29500}"
if [ "$NODE_RANK" -lt 2 ]; then NPROC=8
elif [ "$NODE_RANK" -lt 3 ]; then NPROC=4
else echo "NODE_RANK must be below 3" >&2; exit 2; fi
torchrun \
  --nnodes 3 \
  --nproc-per-node "$NPROC" \
  --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" \
  --master-port "$MASTER_PORT" \
  train.py
