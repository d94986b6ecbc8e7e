"""One verdict per value, wherever a request comes in: for every entry of the table of limits
(app.core.request.limits, app.contract.limits), each boundary value and the one just past it
(and null) go to `POST /v1/plans`, to `POST /v1/checks` (checks run on a fake runner: admission
is the real one) and to the rank program's parsing of its `--request` (`check_request`, what
`python -m app.worker.gradcheck --request` runs first). Each refuses it at the same pointer or
lets it through; none answers 5xx or raises anything but the field's error.

"Lets it through" is the limits' verdict: the planner or the worker may still refuse a valid
value for what it is (an accumulation too long to run, a batch larger than a check holds), at
its own problem type, never the schema's `validation-error`.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.fake_runner import FakeRunner

from app.contract.limits import CHECK_LIMITS
from app.contract.request import check_request
from app.core.errors.domain import DomainError
from app.core.request.bounds import Bounds, Limits
from app.core.request.limits import PLAN_LIMITS
from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PLAN: dict[str, Any] = {"topology": {"num_nodes": 1, "gpus_per_node": 1}, "micro_batch_size": 1}
GROUP = {"name": "g0", "num_nodes": 1, "gpus_per_node": 1}
POINT = {"micro_batch_size": 1, "samples_per_s": 100.0}
PROBE: dict[str, Any] = {
    "best_rule": "linear",
    "base": {"batch_size": 256, "lr": 0.1, "curve": [{"samples": 0, "loss": 1.0}]},
    "rules": [{"rule": "linear", "lr": 0.1, "final_loss_ratio": 1.0, "curve": [{"samples": 0, "loss": 1.0}]}],
}
# What a field needs around it to be a request at all, by the longest prefix of its path.
PLAN_AROUND: dict[str, dict[str, Any]] = {
    "": PLAN,
    "topology.throughput_curve": {**PLAN, "topology": {**PLAN["topology"], "throughput_curve": [POINT]}},
    "topology.node_groups": {**PLAN, "topology": {"node_groups": [GROUP]}},
    "topology.node_groups.throughput_curve": {
        **PLAN,
        "topology": {"node_groups": [{**GROUP, "throughput_curve": [POINT]}]},
    },
    "dataset": {**PLAN, "dataset": {"num_samples": 64}},
    # A stream's own fields, on a stream (on a map they are refused at /dataset, at every door).
    "dataset.num_shards": {
        **PLAN,
        "dataset": {"kind": "stream", "num_samples": 64, "splitter": "rank_worker"},
    },
    "dataset.num_workers": {**PLAN, "dataset": {"kind": "stream", "num_samples": 64, "num_shards": 1}},
    "dataset.shard_samples": {**PLAN, "dataset": {"kind": "stream", "splitter": "rank_worker"}},
    "learning_rate": {**PLAN, "learning_rate": {"base_lr": 0.1}},
    "learning_rate.lr_scaling": {
        **PLAN,
        "learning_rate": {"base_lr": 0.1, "rule": "measured", "lr_scaling": PROBE},
    },
    "gradient_noise_scale_stderr": {**PLAN, "gradient_noise_scale": 4096.0},
    "packing": {
        **PLAN,
        "sequence_length": 2048,
        "loss_normalization": "token",
        "packing": {"mode": "token_budget", "max_tokens_per_micro_batch": 4096},
    },
    "resume": {**PLAN, "resume": {"optimizer_step": 0}},
    "recommend": {
        **PLAN,
        "sequence_length": 2048,
        "recommend": {"law": "step_law", "train_tokens": 10**11, "non_embedding_params": 10**9},
    },
    "recommend.architecture": {
        **PLAN,
        "sequence_length": 2048,
        "recommend": {
            "law": "step_law",
            "train_tokens": 10**11,
            "architecture": {"layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_heads": 16},
        },
    },
}
CHECK_AROUND: dict[str, dict[str, Any]] = {
    "": {},
    "noise_scale": {"noise_scale": {"steps": 0}},
    "fit_micro_batch": {"fit_micro_batch": {"memory_bytes": 1 << 30}},
    "rendezvous": {"rendezvous": {"endpoint": "127.0.0.1:29400", "nnodes": 1, "run_id": "limits"}},
    "resume": {"steps": 2, "resume": {"at_step": 1, "data_parallel_size": 1}},
    "throughput": {"throughput": {}},
    "lr_scaling": {"lr_scaling": {"samples": 64}},
}
LR_PLAN = PLAN_AROUND["learning_rate"]
RULES = ["none", "sqrt", "linear"]


def _items(path: str, n: int) -> list[Any]:
    """`n` items that the list at `path` takes (a curve strictly increasing, groups named apart)."""
    last = path.rsplit(".", 1)[-1]
    makers: dict[str, Callable[[int], Any]] = {
        "throughput_curve": lambda i: {"micro_batch_size": i + 1, "samples_per_s": float(i + 1)},
        "node_groups": lambda i: {**GROUP, "name": f"g{i}"},
        "betas": lambda i: 0.9,
        "milestones": lambda i: i + 1,
        "milestone_epochs": lambda i: float(i + 1),
        "curve": lambda i: {"samples": i, "loss": 1.0},
        "rules": (lambda i: RULES[i % 3]) if path == "lr_scaling.rules" else (lambda i: PROBE["rules"][0]),
        "micro_batch_sizes": lambda i: i + 1,
        "shard_samples": lambda i: 1,
    }
    return [makers[last](i) for i in range(n)]


def _cases(bounds: Bounds) -> Iterator[tuple[Any, bool]]:
    """(value, valid): each bound's boundary and the value just past it, and null."""
    step = (lambda x, to: x + (1 if to > x else -1)) if bounds.kind != "float" else math.nextafter
    for bound, inside, closed in (
        (bounds.ge, math.inf, True),
        (bounds.gt, math.inf, False),
        (bounds.le, -math.inf, True),
        (bounds.lt, -math.inf, False),
    ):
        if bound is None:
            continue
        past = step(bound, -inside)
        yield (bound, True) if closed else (step(bound, inside), True)
        if not closed:
            yield bound, False
        elif past >= 0 or bounds.kind == "float":
            yield past, False
    yield None, bounds.allow_null


def _body(around: dict[str, dict[str, Any]], path: str, value: Any, table: Limits) -> dict[str, Any]:
    """The request of `around` for this path with `value` at it (a count of items for a list)."""
    plain = path.replace("[]", "")
    prefix = max((p for p in around if plain == p or plain.startswith(p + ".") or not p), key=len)
    body = copy.deepcopy(around[prefix])
    parts = path.replace("[]", ".[]").split(".")
    node: Any = body
    for i, (part, following) in enumerate(itertools.pairwise(parts)):
        if part == "[]":
            node = node[0]
            continue
        if part not in node:
            listed = ".".join(parts[: i + 1]).replace(".[]", "[]")
            node[part] = _items(listed, int(table[listed].ge or 1)) if following == "[]" else {}
        node = node[part]
    bounds = table[path]
    node[0 if parts[-1] == "[]" else parts[-1]] = (
        _items(path, value) if bounds.kind == "items" and value is not None else value
    )
    return body


def _pointer(path: str) -> str:
    return "/" + path.replace("[]", ".0").replace(".", "/")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("jobs") / "jobs.sqlite3"
    settings = Settings(jobs_db=db, log_level="warning", queue_size=100_000)
    with TestClient(create_app(settings, runner=FakeRunner()), raise_server_exceptions=False) as test_client:
        yield test_client


def _schema_refused(response: Any) -> set[str]:
    """The pointers the HTTP schema refused (none when the body passed it); never a 5xx."""
    assert response.status_code < 500, response.text
    problem = response.json() if response.status_code >= 400 else {}
    if problem.get("type", "").endswith(":validation-error"):
        return {e["pointer"] for e in problem["errors"]}
    return set()


def _rank_refused(body: dict[str, Any]) -> set[str]:
    try:
        check_request(json.loads(json.dumps(body)))
    except DomainError as err:
        return {err.pointer}
    return set()


def _verdicts(client: TestClient, plan: dict[str, Any] | None, check: dict[str, Any]) -> dict[str, set[str]]:
    out = {"POST /v1/checks": _schema_refused(client.post("/v1/checks", json=check))}
    out["--request"] = _rank_refused(check)
    if plan is not None:
        out["POST /v1/plans"] = {f"/plan{p}" for p in _schema_refused(client.post("/v1/plans", json=plan))}
    return out


def _one_verdict(verdicts: dict[str, set[str]], pointer: str, valid: bool) -> None:
    """Every door refused the same pointers; an invalid value at its field (a tuple's at the
    item missing) and nothing else, a valid one not there (a rule of the request's form, such
    as a topology needing its GPU counts, may still refuse it elsewhere: at every door alike)."""
    first, *others = verdicts.values()
    assert all(other == first for other in others), verdicts
    at_field = {p for p in first if p == pointer or p.startswith(pointer + "/")}
    assert at_field == first if not valid else not at_field, verdicts
    assert valid or len(first) == 1, verdicts


@pytest.mark.parametrize("path", list(PLAN_LIMITS))
def test_a_plan_field_has_one_verdict_at_every_door(client: TestClient, path: str) -> None:
    bounds = PLAN_LIMITS[path]
    for value, valid in _cases(bounds):
        plan = _body(PLAN_AROUND, path, value, PLAN_LIMITS)
        _one_verdict(_verdicts(client, plan, {"plan": plan}), "/plan" + _pointer(path), valid)


@pytest.mark.parametrize("path", [p for p in CHECK_LIMITS if not p.startswith("plan.")])
def test_a_check_field_has_one_verdict_at_every_door(client: TestClient, path: str) -> None:
    bounds = CHECK_LIMITS[path]
    plan = LR_PLAN if path.startswith("lr_scaling") else PLAN
    for value, valid in _cases(bounds):
        check = {"plan": plan, **_body(CHECK_AROUND, path, value, CHECK_LIMITS)}
        _one_verdict(_verdicts(client, None, check), _pointer(path), valid)


@pytest.mark.slow
def test_the_rank_program_refuses_what_post_v1_checks_refuses(client: TestClient) -> None:
    """The drift this table ended: warmup_epochs above the schema's 1,000,000 ran on the rank."""
    body = {"plan": {**LR_PLAN, "learning_rate": {"base_lr": 0.1, "warmup_epochs": 1_000_001}}}
    pointer = "/plan/learning_rate/warmup_epochs"
    assert _schema_refused(client.post("/v1/checks", json=body)) == {pointer}
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    command = [sys.executable, "-m", "app.worker.gradcheck", "--request", json.dumps(body)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {pointer}: warmup_epochs must be a finite number from 0 to 1000000, not 1000001"
    ]
    assert done.stdout == ""
