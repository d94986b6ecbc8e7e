"""The preflight of the launch exports (slurm, torchrun, kubernetes): before training, the
gradient check of the same plan runs with the same launcher (`python -m app.worker.gradcheck`
under the same torchrun line) and, with `model_factory`, the user's own model. A plan that does
not hold there stops the job with the reason in its output, before it burns GPU hours.

Rank 0 of the check prints the result JSON; the launch script captures it and judges it with
`VERDICT` (a few lines of Python the job's own interpreter runs), which exits 1 on a failure.
The job's environment needs batchplan installed (`pip install batchplan`), as it needs torch.
"""

from __future__ import annotations

import json
import shlex
import textwrap
from dataclasses import asdict
from typing import Any

from app.core.exports.parts.export_types import ExportInput
from app.core.records.plan_request import LearningRateSpec, NodeGroup, PlanRequest
from app.core.request.dataset import dataset_json
from app.core.request.parse import curve_json, lr_scaling_json, section_json

# Reads the check's output (argv[1]), prints what it found and exits 1 unless it passed. The
# node without rank 0 sees no result: the node that has it decides.
VERDICT = r"""
import json, sys
found = [json.loads(line) for line in sys.argv[1].splitlines() if line.startswith('{"passed"')]
if not found:
    print("batchplan preflight: the check printed no result here, training not started", file=sys.stderr)
    sys.exit(1)
r = found[-1]
head = (f"{r['processes']} processes on {r['nnodes']} node(s), micro-batches {r['micro_batch_sizes']}, "
        f"accumulation {r['gradient_accumulation_steps']}, global batch {r['global_batch_size']}")
if r["passed"]:
    print(f"batchplan preflight passed: {head}; rel_l2 {r['rel_l2']:.3g} <= {r['tolerance']:.3g}")
    sys.exit(0)
reasons = [r["ddp_equivalence"]["summary"]]
breaking = [f for f in r["ddp_equivalence"]["findings"] if f["breaks_equivalence"]]
reasons += [f"{f['cause']}: {f['detail']} (fix: {f['fix']})" for f in breaking]
reasons += [f"control {c['name']} not detected" for c in r["controls"] if not c["detected"]]
print(f"batchplan preflight FAILED, training not started: {head}; " + "; ".join(reasons), file=sys.stderr)
sys.exit(1)
""".strip()

# With preflight_steps above 1, the verdict also says how the run went, and where it left the
# reference run when it did.
RUN_VERDICT = VERDICT.replace(
    """if r["passed"]:""",
    """off = [s for s in r.get("trajectory") or [] if not s["within_tolerance"]]
if r.get("trajectory"):
    head += f"; a run of {r['steps']} steps ending {r['final_params_rel_l2']:.3g} from a single-process run"
if r["passed"]:""",
).replace(
    """reasons += [f"control {c['name']} not detected" for c in r["controls"] if not c["detected"]]""",
    """reasons += [f"control {c['name']} not detected" for c in r["controls"] if not c["detected"]]
reasons += [f"the run left the single-process run at step {s['step']} (parameters {s['params_rel_l2']:.3g} "
            f"apart, loss {s['loss']!r} against {s['reference_loss']!r})" for s in off[:1]]""",
)


def plan_json(request: PlanRequest) -> dict[str, Any]:
    """The plan request as POST /v1/plans takes it (`app.core.request.parse` reads it back)."""
    topology = request.topology
    data: dict[str, Any] = {
        "topology": {"node_groups": [_group_json(g) for g in topology.node_groups]}
        if topology.listed_groups
        else {
            "num_nodes": topology.node_groups[0].num_nodes,
            "gpus_per_node": topology.node_groups[0].gpus_per_node,
            **_curve_of(topology.node_groups[0]),
        },
        "global_batch_size": request.global_batch_size,
        "micro_batch_size": request.micro_batch_size,
        "gradient_accumulation_steps": request.gradient_accumulation_steps,
        "max_micro_batch_size": request.max_micro_batch_size,
        "divisibility": request.divisibility.value,
        "parallelism": asdict(request.parallelism),
        "loss_reduction": request.loss_reduction.value,
        "dataset": dataset_json(request.dataset, _plain) if request.dataset else None,
        "sequence_length": request.sequence_length,
        "global_batch_tokens": request.global_batch_tokens,
        "micro_batch_tokens": request.micro_batch_tokens,
        "loss_normalization": request.loss_normalization.value,
        "packing": section_json(request.packing) if request.packing else None,
        "resume": section_json(request.resume) if request.resume else None,
    }
    return {k: v for k, v in data.items() if v is not None}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _curve_of(group: NodeGroup) -> dict[str, Any]:
    curve = group.throughput_curve
    return {"throughput_curve": curve_json(curve)} if curve is not None else {}


def _group_json(group: NodeGroup) -> dict[str, Any]:
    out = {k: v for k, v in asdict(group).items() if k != "throughput_curve"}
    return out | _curve_of(group)


def _learning_rate_json(spec: LearningRateSpec) -> dict[str, Any]:
    out = {k: v for k, v in asdict(spec).items() if v is not None and k != "lr_scaling"}
    if spec.lr_scaling is not None:
        out["lr_scaling"] = lr_scaling_json(spec.lr_scaling)
    return out


def check_request(x: ExportInput) -> str:
    """The check request (the body of POST /v1/checks) as one line of JSON; a run of
    preflight_steps trains the plan's recipe, so its learning_rate goes with it."""
    steps = x.options.preflight_steps
    if steps <= 1:
        return json.dumps({"plan": plan_json(x.request)}, separators=(",", ":"))
    plan = plan_json(x.request)
    if x.request.learning_rate is not None:
        plan["learning_rate"] = _learning_rate_json(x.request.learning_rate)
    return json.dumps({"plan": plan, "steps": steps}, separators=(",", ":"))


def check_args(x: ExportInput, *, every_node: bool = False) -> list[str]:
    """What replaces the training script on the torchrun line: the rank program and its request,
    read from $BATCHPLAN_PREFLIGHT_REQUEST (set by the launch script). `every_node`: the script
    runs on each node and judges from that node's output alone (torchrun, PyTorchJob), so each
    node prints the verdict; under srun one script reads every node's output."""
    args = ["-m", "app.worker.gradcheck", "--request", '"$BATCHPLAN_PREFLIGHT_REQUEST"']
    if every_node:
        args.append("--result-on-every-node")
    if x.options.model_factory:
        args += ["--model-factory", x.options.model_factory]
    return args


def preflight_lines(x: ExportInput, launch: str) -> list[str]:
    """Shell lines that run `launch` (a command whose output holds rank 0's result JSON) and stop
    the script unless the check passed. `set -e` is on in every launch script."""
    model = x.options.model_factory or "the built-in model"
    steps = x.options.preflight_steps
    run = "" if steps <= 1 else f", a run of {steps} steps of its recipe"
    said = textwrap.wrap(
        f"Preflight: the gradient check of this plan ({model}{run}), under the same launcher, before "
        "training (export with preflight=false to leave it out). A plan that does not hold here stops "
        "the job with the reason below. The job's environment needs batchplan installed.",
        92,
    )
    return [
        *(f"# {line}" for line in said),
        f"export BATCHPLAN_PREFLIGHT_REQUEST={shlex.quote(check_request(x))}",
        f'preflight="$({launch})" || {{ status=$?; echo "batchplan preflight: the gradient check failed'
        ' (exit $status), training not started" >&2; exit "$status"; }',
        "python - \"$preflight\" <<'BATCHPLAN_VERDICT'",
        VERDICT if x.options.preflight_steps <= 1 else RUN_VERDICT,
        "BATCHPLAN_VERDICT",
    ]
