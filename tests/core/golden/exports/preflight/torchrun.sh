#!/usr/bin/env bash
# batchplan: 16 GPUs, data-parallel size 16
# global batch 512 = micro-batch 32 x accumulation 1 x 16 replicas
# learning rate 0.2 (linear rule from 0.1 per 256), warmup 12515 steps from 0.1
# lr schedule: linear warmup from 0.1 to 0.2 over 12515 optimizer steps, then constant 0.2
# optimizer sgd, momentum 0.9, no weight decay, no gradient clipping
# warning: 1 sample per epoch is seen twice: DistributedSampler pads 1281167 to 1281168
# warning: the last micro-batch of each epoch holds 9 of 32 samples per replica, so its samples weigh more in that step's gradient
set -euo pipefail
# The job's environment (the export's setup option):
source /venv/bin/activate
export GLOBAL_BATCH_SIZE=512 MICRO_BATCH_SIZE=32 GRADIENT_ACCUMULATION_STEPS=1
# Multi-node: run this same script on each of the 2 nodes. The c10d rendezvous
# numbers the nodes as they join; MASTER_ADDR is any one node, the same everywhere.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of one node, the same on every node}"
MASTER_PORT="${MASTER_PORT:-29500}"
# Preflight: the gradient check of this plan (mypkg.models:build, a run of 3 steps of its
# recipe), under the same launcher, before training (export with preflight=false to leave it
# out). A plan that does not hold here stops the job with the reason below. The job's
# environment needs batchplan installed.
export BATCHPLAN_PREFLIGHT_REQUEST='{"plan":{"topology":{"num_nodes":2,"gpus_per_node":8},"global_batch_size":512,"divisibility":"exact","parallelism":{"tensor":1,"pipeline":1,"context":1,"data_parallel_shard":1,"expert":1},"loss_reduction":"mean","dataset":{"num_samples":1281167,"shuffle":true,"seed":0,"drop_last":false,"epochs":90},"loss_normalization":"sample","learning_rate":{"base_lr":0.1,"base_batch_size":256,"rule":"linear","optimizer":"sgd","warmup_epochs":5.0,"betas":[0.9,0.999],"eps":1e-08,"gamma":0.1,"nesterov":false,"weight_decay":0.0}},"steps":3}'
preflight="$(torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id "${RDZV_ID:-batchplan}" \
  -m app.worker.gradcheck \
  --request "$BATCHPLAN_PREFLIGHT_REQUEST" \
  --result-on-every-node \
  --model-factory mypkg.models:build)" || { status=$?; echo "batchplan preflight: the gradient check failed (exit $status), training not started" >&2; exit "$status"; }
python - "$preflight" <<'BATCHPLAN_VERDICT'
import json, sys
found = [json.loads(line) for line in sys.argv[1].splitlines() if line.startswith('{"passed"')]
if not found:
    print("batchplan preflight: the check printed no result here, training not started", file=sys.stderr)
    sys.exit(1)
r = found[-1]
head = (f"{r['processes']} processes on {r['nnodes']} node(s), micro-batches {r['micro_batch_sizes']}, "
        f"accumulation {r['gradient_accumulation_steps']}, global batch {r['global_batch_size']}")
off = [s for s in r.get("trajectory") or [] if not s["within_tolerance"]]
if r.get("trajectory"):
    head += f"; a run of {r['steps']} steps ending {r['final_params_rel_l2']:.3g} from a single-process run"
if r["passed"]:
    print(f"batchplan preflight passed: {head}; rel_l2 {r['rel_l2']:.3g} <= {r['tolerance']:.3g}")
    sys.exit(0)
reasons = [r["ddp_equivalence"]["summary"]]
breaking = [f for f in r["ddp_equivalence"]["findings"] if f["breaks_equivalence"]]
reasons += [f"{f['cause']}: {f['detail']} (fix: {f['fix']})" for f in breaking]
reasons += [f"control {c['name']} not detected" for c in r["controls"] if not c["detected"]]
reasons += [f"the run left the single-process run at step {s['step']} (parameters {s['params_rel_l2']:.3g} "
            f"apart, loss {s['loss']!r} against {s['reference_loss']!r})" for s in off[:1]]
print(f"batchplan preflight FAILED, training not started: {head}; " + "; ".join(reasons), file=sys.stderr)
sys.exit(1)
BATCHPLAN_VERDICT
torchrun \
  --nnodes 2 \
  --nproc-per-node 8 \
  --rdzv-backend c10d \
  --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id "${RDZV_ID:-batchplan}" \
  train.py
