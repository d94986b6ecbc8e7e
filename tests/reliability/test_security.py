"""What a hostile client must not be able to make the worker do.

- run anything but the built-in model or one the operator registered: a request names a
  model, never a module path; no request field reaches an import, eval or unpickling; the
  one dynamic import resolves operator settings only; unknown fields are refused;
- allocate huge tensors: sizes that would make the check materialise a huge batch or epoch
  are refused with 422 before the job is queued;
- spawn a shell: no subprocess with shell=True, no os.system, in app/.

Nothing here runs a rank but the one test of registered models, on a real server: the other
check endpoints are served by a service that stores jobs and never runs them
(conftest.queued_only_client).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest
from support.servers import serve

APP = Path(__file__).resolve().parents[2] / "app"
TWO = {"num_nodes": 1, "gpus_per_node": 2}
EXAMPLES = "app.worker.example_models"


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            out.append((ast.unparse(node.func), node))
    return out


def test_no_shell_eval_exec_pickle_or_dynamic_import_in_the_app() -> None:
    forbidden = {"eval", "exec", "os.system", "os.popen", "pickle.loads", "pickle.load", "__import__"}
    forbidden |= {"importlib.import_module", "import_module", "marshal.loads", "compile"}
    found = []
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for name, call in _calls(tree):
            if name in forbidden:
                found.append(f"{path.relative_to(APP.parent)}:{name}")
            for keyword in call.keywords:
                if keyword.arg == "shell" and not (
                    isinstance(keyword.value, ast.Constant) and keyword.value.value is False
                ):
                    found.append(f"{path.relative_to(APP.parent)}:{name}(shell=...)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n in ("pickle", "marshal", "dill", "cloudpickle", "shelve") for n in names):
                    found.append(f"{path.relative_to(APP.parent)}:{node.lineno} imports {names}")
    # The one dynamic import: a registered factory (BATCHPLAN_CHECK_MODELS), in the rank, and
    # the rank server the fork server runs (a constant).
    assert found == ["app/contract/targets.py:importlib.import_module"]


def test_a_spec_carries_a_model_name_and_nothing_to_import() -> None:
    from app.contract.codec import decode, encode
    from app.contract.spec import CheckSpec
    from app.worker.training import workload

    fields = set(CheckSpec.__dataclass_fields__)
    assert "model" in fields and not fields & {"module", "script", "code", "path", "callable", "target"}
    # Without a target a name builds the synthetic model, whatever it says.
    built = workload.load("os.system", None, 0)
    assert type(built) is workload.SyntheticWorkload and built.name == "synthetic"
    spec_json = encode(CheckSpec(1, 1, 1, "mean", "even", (), 1, True, 0, False, 1))
    with pytest.raises(TypeError, match="target"):  # a spec with an extra key does not load
        decode(CheckSpec, {**spec_json, "target": "os:system"})


def _canary(code: Path, marks: Path, module: str) -> None:
    """A factory module that leaves a mark when anything imports it (the server or a rank)."""
    (code / f"{module}.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marks / module)!r}).touch()\n"
        "from app.worker.example_models import mlp as factory\n"
    )


@pytest.mark.slow
def test_the_one_import_resolves_only_operator_settings(tmp_path: Path) -> None:
    """On a real server: the worker imports what the operator registered (BATCHPLAN_CHECK_MODELS)
    and nothing a request names. An unregistered name, module or import path is refused at
    /model and its code is never imported, by the server or its ranks; a registered name runs."""
    pytest.importorskip("torch")
    code, marks = tmp_path / "code", tmp_path / "imported"
    code.mkdir()
    marks.mkdir()
    for module in ("registered_canary", "unregistered_canary"):
        _canary(code, marks, module)
    env = {
        "BATCHPLAN_JOBS_DB": str(tmp_path / "jobs.sqlite3"),
        "BATCHPLAN_PROCESSES_PER_HOST": "2",
        "BATCHPLAN_CHECK_MODELS": "ok=registered_canary:factory",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])),
    }
    with serve(env, tmp_path / "server.log") as server:
        server.wait_warm(2, models=True)
        assert (marks / "registered_canary").exists(), "the control: a registered factory is imported"
        plan = {"topology": TWO, "global_batch_size": 16}
        for model in ["unregistered_canary", "unregistered_canary:factory", "os:system", f"{EXAMPLES}:mlp"]:
            response = server.client.post("/v1/checks", json={"plan": plan, "model": model})
            assert response.status_code == 422, response.text
            assert response.json()["errors"][0]["pointer"] == "/model"
        assert server.client.get("/v1/checks").json()["checks"] == []
        job = server.check({"plan": plan, "model": "ok", "noise_scale": {"steps": 0}})
        assert job["status"] == "succeeded" and job["result"]["passed"] and job["result"]["model"] == "ok"
    assert not (marks / "unregistered_canary").exists(), "a name a request gave reached an import"


@pytest.mark.parametrize(
    "model", ["torchvision.models.resnet50", "app.worker.example_models:mlp", "subprocess:run", "../evil", ""]
)
def test_a_model_is_a_registered_name_never_a_path(queued_only_client: Any, model: str) -> None:
    body = {"plan": {"topology": TWO, "global_batch_size": 16}, "model": model}
    response = queued_only_client.post("/v1/checks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/model"
    assert queued_only_client.get("/v1/checks").json()["checks"] == []


@pytest.mark.parametrize(
    "extra",
    [
        {"model_path": "/tmp/evil.pt"},
        {"module": "subprocess:run"},
        {"code": "import os; os.system('id')"},
        {"plan": {"topology": TWO, "global_batch_size": 16, "model": "x"}},
        {"plan": {"topology": {**TWO, "init": "os.system"}, "global_batch_size": 16}},
    ],
)
def test_unknown_model_or_code_fields_are_refused(queued_only_client: Any, extra: dict[str, Any]) -> None:
    body = {"plan": {"topology": TWO, "global_batch_size": 16}, **extra}
    response = queued_only_client.post("/v1/checks", json=body)
    assert response.status_code == 422, response.text
    assert "Extra inputs are not permitted" in response.text
    assert queued_only_client.get("/v1/checks").json()["checks"] == []


def test_replica_cap_is_enforced_before_queueing(queued_only_client: Any) -> None:
    body = {"plan": {"topology": {"num_nodes": 32768, "gpus_per_node": 8}, "global_batch_size": 262144}}
    response = queued_only_client.post("/v1/checks", json=body)
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/plan/topology"


def test_timeout_above_the_server_cap_is_refused(queued_only_client: Any) -> None:
    response = queued_only_client.post(
        "/v1/checks", json={"plan": {"topology": TWO, "global_batch_size": 16}, "timeout_s": 3600}
    )
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/timeout_s"


HUGE = [
    # micro-batch 2^40 on 2 replicas: the check would build a 2^41-sample batch and epoch
    pytest.param({"topology": TWO, "micro_batch_size": 2**40}, "/plan/", id="micro-batch-2^40"),
    pytest.param({"topology": TWO, "global_batch_size": 2**30}, "/plan/", id="global-batch-2^30"),
    # a dataset of 2^53-1 samples: the rank builds torch.randperm(num_samples).tolist()
    pytest.param(
        {"topology": TWO, "global_batch_size": 16, "dataset": {"num_samples": 2**53 - 1}},
        "/plan/dataset/num_samples",
        id="dataset-2^53-1",
    ),
    pytest.param(
        {"topology": TWO, "global_batch_size": 16, "dataset": {"num_samples": 10**9}},
        "/plan/dataset/num_samples",
        id="dataset-10^9",
    ),
]


@pytest.mark.parametrize("plan, pointer", HUGE)
def test_memory_heavy_checks_are_refused_before_any_tensor(
    queued_only_client: Any, plan: dict[str, Any], pointer: str
) -> None:
    response = queued_only_client.post("/v1/checks", json={"plan": plan})
    jobs = queued_only_client.get("/v1/checks").json()["checks"]
    for job in jobs:  # never let an accepted one run anywhere
        queued_only_client.delete(f"/v1/checks/{job['id']}")
    assert response.status_code == 422, response.text
    assert any(e["pointer"].startswith(pointer) for e in response.json()["errors"])
    assert jobs == []


def test_the_same_sizes_are_fine_for_the_planner(queued_only_client: Any) -> None:
    """The planner is arithmetic only: huge sizes cost nothing there and are planned."""
    for param in HUGE:
        plan = param.values[0]
        response = queued_only_client.post("/v1/plans", json=plan)
        assert response.status_code == 200, response.text


def test_a_rendezvous_may_only_name_hosts_the_operator_allowed(queued_only_client: Any) -> None:
    """The worker connects to (or serves) the endpoint: an arbitrary host would let a client
    make the server probe other machines."""
    body = {
        "plan": {"topology": TWO, "global_batch_size": 16},
        "rendezvous": {"endpoint": "10.0.0.1:29400", "nnodes": 2, "run_id": "probe"},
    }
    response = queued_only_client.post("/v1/checks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/rendezvous/endpoint"
    assert "BATCHPLAN_RENDEZVOUS_HOSTS" in response.json()["detail"]
    assert queued_only_client.get("/v1/checks").json()["checks"] == []
