"""The worker's web side part by part, without HTTP: Admission turns a check request into the
job to submit and refuses what the rank program refuses; Execution runs a stored job on a
runner and records how it ended; RankPool runs a check on real warm ranks and leaves no
process behind."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.bodies import fast_and_slow, lonely_rendezvous
from support.fake_runner import FakeRunner, passing_result
from support.processes import alive

from app.contract.check_options import DEFAULT_NOISE_STEPS
from app.contract.check_result import CheckResult
from app.contract.codec import decode, encode
from app.contract.jobs import Job, JobStatus
from app.contract.options import Rendezvous
from app.contract.request import build_spec, check_request
from app.core.errors.domain import DomainError
from app.worker.service.admission import Admission
from app.worker.service.execution import Execution
from app.worker.service.limits import Limits
from app.worker.service.runner import CheckOrder, CheckRunner, RankError
from app.worker.service.store import JobStore
from app.worker.service.submission import Submission
from app.worker.service.waiters import Waiters

LIMITS = Limits(
    max_replicas_per_check=64, processes_per_host=4, queue_size=4, check_timeout_s=60, concurrent_checks=1
)
MODELS = {"mlp": "app.worker.example_models:mlp"}
FOUR = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 32, "micro_batch_size": 4}
MESH = {**FOUR, "parallelism": {"tensor": 2}}
TOKENS = {
    "topology": {"num_nodes": 1, "gpus_per_node": 4},
    "sequence_length": 16,
    "global_batch_tokens": 256,
    "micro_batch_tokens": 32,
    "loss_normalization": "token",
}
FIT = {"memory_bytes": 1 << 30}


class _Admitted:
    """An Admission that takes a request's JSON, as the route hands over its validated body."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def prepare(self, body: dict[str, Any]) -> Submission:
        return self.admission.prepare(check_request(body), body)


def admission(runner: CheckRunner | None = None) -> _Admitted:
    return _Admitted(Admission(LIMITS, MODELS, runner or FakeRunner(size=LIMITS.processes_per_host)))


def test_admission_submits_the_spec_the_rank_program_builds() -> None:
    body = {"plan": FOUR, "model": "mlp", "seed": 3, "timeout_s": 30}
    submission = admission().prepare(body)
    assert submission.spec == build_spec(check_request(body))
    # The body as sent, with the workload that runs (the plan chose it: the request said none).
    assert submission.body == {**body, "workload": "synthetic"}
    assert submission.timeout_s == 30 and submission.rendezvous is None
    # A registered model over four replicas measures its noise scale by default.
    assert submission.spec.model == "mlp" and submission.spec.noise_steps == DEFAULT_NOISE_STEPS
    # The job store keeps it as JSON; what comes back is the same submission.
    stored = json.loads(json.dumps(encode(submission)))
    assert decode(Submission, stored) == submission


REFUSED = {
    "mesh_searching_a_micro_batch": ({"plan": MESH, "fit_micro_batch": FIT}, "/fit_micro_batch"),
    "mesh_measuring_noise": ({"plan": MESH, "noise_scale": {"steps": 4}}, "/noise_scale/steps"),
    "mesh_of_tokens": ({"plan": {**TOKENS, "parallelism": {"tensor": 2}}}, "/workload"),
    "tokens_searching_a_micro_batch": ({"plan": TOKENS, "fit_micro_batch": FIT}, "/fit_micro_batch"),
    "tokens_measuring_noise": ({"plan": TOKENS, "noise_scale": {"steps": 2}}, "/noise_scale/steps"),
    "an_infeasible_plan": ({"plan": {**FOUR, "global_batch_size": 30}}, "/plan/global_batch_size"),
}


@pytest.mark.parametrize("body,pointer", REFUSED.values(), ids=list(REFUSED))
def test_the_rank_program_refuses_what_admission_refuses(
    body: dict[str, Any], pointer: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTP and under torchrun alike: before, a mesh plan with fit_micro_batch was refused
    over HTTP but ran under torchrun, where the mesh check never reads it."""
    pytest.importorskip("torch")
    from app.worker.rank import program

    with pytest.raises(DomainError) as refused:
        admission().prepare(body)
    assert refused.value.pointer == pointer
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert program.main(["--request", json.dumps(body)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {pointer}: {refused.value.detail}")


def run_jobs(store: JobStore, runner: FakeRunner, bodies: dict[str, dict[str, Any]]) -> dict[str, Job]:
    """Each body submitted as its job id, then run by an Execution until every job finished."""

    async def scenario() -> dict[str, Job]:
        runner.start()
        execution = Execution(store, runner, LIMITS, MODELS)
        for job_id, body in bodies.items():
            store.create(job_id, encode(admission(runner).prepare(body)))
            execution.enqueue(job_id, submitted=time.monotonic())
        execution.start()
        async with asyncio.timeout(30):
            while not all(store.get(j).status.finished for j in bodies):  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
        execution.begin_shutdown()
        await execution.wait()
        return {j: store.get(j) for j in bodies}  # type: ignore[misc]

    return asyncio.run(scenario())


def test_execution_runs_a_stored_job_and_records_its_result_and_times(tmp_path: Path) -> None:
    store, runner = JobStore(tmp_path / "jobs.sqlite3"), FakeRunner()
    job = run_jobs(store, runner, {"a": {"plan": FOUR, "model": "mlp"}})["a"]
    (order,) = runner.orders
    assert job.status is JobStatus.SUCCEEDED and job.error is None
    assert order.spec == admission().prepare({"plan": FOUR, "model": "mlp"}).spec  # through the store
    assert order.model_target == MODELS["mlp"] and order.job_id == "a"
    result = decode(CheckResult, job.result)
    timings = result.timings
    assert {"check", "queued", "end_to_end"} <= set(timings)
    assert timings["end_to_end"] >= timings["check"]
    expected = encode(passing_result(order))
    assert {k: v for k, v in job.result.items() if k != "timings_s"} == {  # type: ignore[union-attr]
        k: v for k, v in expected.items() if k != "timings_s"
    }


def test_execution_records_a_rank_error_and_a_timeout(tmp_path: Path) -> None:
    store, runner = JobStore(tmp_path / "jobs.sqlite3"), FakeRunner()
    runner.error = RankError("rank 1 fell over")
    failed = run_jobs(store, runner, {"b": {"plan": FOUR}})["b"]
    assert failed.status is JobStatus.FAILED and failed.result is None
    assert failed.error is not None and failed.error.startswith("rank 1 fell over")
    runner.error, runner.gate = None, asyncio.Event()  # never set: the check waits past its timeout
    late = run_jobs(store, runner, {"c": {"plan": FOUR, "timeout_s": 0.2}})["c"]
    assert late.status is JobStatus.FAILED and "did not finish within timeout_s=0.2" in str(late.error)


@pytest.mark.slow
def test_a_rank_pool_runs_a_check_on_warm_ranks_and_leaves_nothing_behind() -> None:
    """And its ranks wait past the check's timeout_s for a rendezvous that never completes:
    the service's deadline ends a check in its own words, never a rank's store timeout that
    fires at the same instant (seen in CI as "DistStoreError: wait timeout after 4000ms")."""
    pytest.importorskip("torch")
    from tests.support.rank_pools import warm_pool

    body = {"plan": fast_and_slow(2.0, 24)}

    async def scenario() -> tuple[CheckResult, BaseException | None, list[int]]:
        async with warm_pool(2) as pool:
            submission = Admission(LIMITS, {}, pool).prepare(check_request(body), body)
            result = await pool.run_check(CheckOrder("direct", submission.spec, 60, None, None))
            pids = [r.pid for r in pool.processes if r.pid is not None]
            lonely = CheckOrder("lonely", submission.spec, 1, decode(Rendezvous, lonely_rendezvous()), None)
            waited: BaseException | None = None
            try:
                await asyncio.wait_for(pool.run_check(lonely), 4)
            except (TimeoutError, RankError) as err:
                waited = err
            return result, waited, pids + [r.pid for r in pool.processes if r.pid is not None]

    result, waited, pids = asyncio.run(scenario())
    assert result.passed and result.gradient.rel_l2 <= result.gradient.tolerance
    assert result.setup.processes == 2 and result.layout.split == "proportional"
    assert result.node_rank == 0 and "check" not in result.timings  # the service, not the pool, times
    assert isinstance(waited, TimeoutError), waited
    assert len(pids) >= 2 and not any(alive(pid) for pid in pids)


def test_waiters_wake_on_their_jobs_finish_and_all_at_once_when_the_server_shuts_down() -> None:
    async def main() -> None:
        waiters = Waiters()
        a, b = waiters.register("a"), waiters.register("b")
        assert waiters.register("a") is a  # two requests waiting for one job share its event
        waiters.notify("a")
        assert a.is_set() and not b.is_set()
        started = time.monotonic()
        waiting = asyncio.create_task(waiters.wait("c", waiters.register("c"), 0.2))
        await asyncio.sleep(0.05)
        assert waiters.waiting() == 1  # a request waits for c now
        await waiting  # nobody finishes c: its time runs out
        assert time.monotonic() - started >= 0.2
        assert waiters.waiting() == 0 and len(waiters) == 2  # c's event stays until c finishes
        waiters.close()
        assert b.is_set()
        late = waiters.register("d")  # after the shutdown began: nothing will wake it, so now
        assert late.is_set()

    asyncio.run(main())


def test_a_job_submitted_here_runs_from_its_submission_without_reading_the_store_back(
    tmp_path: Path,
) -> None:
    store, runner = JobStore(tmp_path / "jobs.sqlite3"), FakeRunner()
    submission = admission(runner).prepare({"plan": FOUR, "model": "mlp"})
    reads: list[str] = []
    read = store.get
    store.get = lambda job_id: reads.append(job_id) or read(job_id)  # type: ignore[method-assign]

    async def scenario() -> Job | None:
        runner.start()
        execution = Execution(store, runner, LIMITS, MODELS)
        store.create("a", encode(submission))
        execution.enqueue("a", submitted=time.monotonic(), submission=submission)
        execution.start()
        async with asyncio.timeout(30):
            while (job := store.cached("a")) is None or not job.status.finished:
                await asyncio.sleep(0.01)
        execution.begin_shutdown()
        await execution.wait()
        return store.cached("a")

    job = asyncio.run(scenario())
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.result_json is not None
    assert reads == [] and runner.orders[0].spec is submission.spec
    assert job == store.get("a")  # what memory served is what the file holds
