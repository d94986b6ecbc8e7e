"""Which check a spec runs: the plan's mesh (mesh_check), the tokens workload (token_check) or
plain DDP replicas (ddp_check), and after that first step, for `steps` above 1, the run of the
plan's recipe (mesh_run on the mesh, run_check on DDP replicas). The one dispatch that the warm
ranks (rank_server) and the rank program under torchrun (gradcheck) share."""

from __future__ import annotations

from app.contract.check_result import CheckResult
from app.contract.spec import CheckSpec
from app.worker.checks.ddp_check import run_ddp_check
from app.worker.checks.mesh_check import run_mesh_check
from app.worker.checks.mesh_run import run_mesh_run
from app.worker.checks.result_parts import CheckGroup
from app.worker.checks.run_check import run_ddp_run
from app.worker.checks.token_check import run_token_check
from app.worker.training.mesh_models import registered_parallelize
from app.worker.training.workload import Workload


def run_spec(
    spec: CheckSpec, group: CheckGroup, workload: Workload, model_target: str | None
) -> CheckResult | None:
    """Run the check on an initialised default process group; rank 0 returns the result."""
    first = _first_step(spec, group, workload, model_target)
    if spec.steps <= 1:
        return first
    if spec.mesh is not None:
        return run_mesh_run(spec, group, workload, registered_parallelize(model_target), first)
    return run_ddp_run(spec, group, workload, first)


def _first_step(
    spec: CheckSpec, group: CheckGroup, workload: Workload, model_target: str | None
) -> CheckResult | None:
    if spec.mesh is not None:
        return run_mesh_check(spec, group, workload, registered_parallelize(model_target))
    if spec.workload == "tokens":
        return run_token_check(spec, group, workload)
    return run_ddp_check(spec, group, workload)
