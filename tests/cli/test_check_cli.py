"""`batchplan check`: a real 2-replica gloo check, on a real server with the worker and locally."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.bodies import fast_and_slow
from support.cli import API_KEY, Invoke, on
from support.servers import Server, serve

from app.cli.output import show_check
from app.client import BatchplanClient, ProblemError

PLAN = ["--gpus-per-node", "2", "-b", "16", "-m", "4"]  # 2 replicas, accumulation 2


def _assert_passed_output(stdout: str) -> None:
    lines = stdout.splitlines()
    assert lines[0].startswith("PASSED: the DDP gradient matches")
    assert "gloo on cpu: 2 processes for 2 replicas (1 per process)" in stdout
    assert any(line.strip().startswith("detected") for line in lines)
    # Two controls cannot differ from the right setup on this plan: named, with why.
    assert re.search(r"^  skipped +unweighted_mean +\S", stdout, re.MULTILINE), stdout
    assert re.search(r"^  skipped +whole_global_batch +\S", stdout, re.MULTILINE), stdout


def _phases(stderr: str, label: str) -> list[str]:
    """The phases of the progress lines (`LABEL: PHASE, 1.2 s`), which are all of stderr."""
    lines = stderr.splitlines()
    found = [re.fullmatch(rf"{label}: (.+), \d+\.\d s", line) for line in lines]
    assert all(found), stderr
    return [m.group(1) for m in found if m]


@pytest.mark.slow
def test_check_on_a_server(run: Invoke, worker_server: Server) -> None:
    out = run("check", *PLAN, "--backend", "gloo", *on(worker_server))
    assert out.exit_code == 0, out.stderr
    _assert_passed_output(out.stdout)
    # Not a terminal: plain progress lines on stderr, one per phase (the ranks are warm).
    assert out.stderr.startswith("check ") and ("running" in out.stderr or "succeeded" in out.stderr)
    phases = _phases(out.stderr, r"check [\w-]+")
    assert phases[-1] == "succeeded"
    assert set(phases) <= {"queued", "waiting for free ranks", "running", "succeeded"}, phases


@pytest.mark.slow
def test_check_on_a_server_whose_ranks_are_still_warming(run: Invoke, tmp_path: Path) -> None:
    env = {
        "BATCHPLAN_WORKER_ENABLED": "true",
        "BATCHPLAN_PROCESSES_PER_HOST": "2",
        "BATCHPLAN_JOBS_DB": str(tmp_path / "jobs.sqlite3"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    with serve(env, tmp_path / "server.log") as cold:  # live, its ranks not yet warm
        out = run("check", *PLAN, "--backend", "gloo", "--url", cold.url)
    assert out.exit_code == 0, out.stderr
    phases = _phases(out.stderr, r"check [\w-]+")
    assert re.fullmatch(r"warming ranks \([01]/2 warm\)", phases[0]), phases
    assert phases[-1] == "succeeded"


@pytest.mark.slow
def test_check_json_from_a_request_file_with_the_key_from_the_environment(
    run: Invoke, worker_server: Server, tmp_path: Path
) -> None:
    request = tmp_path / "check.json"
    request.write_text(json.dumps({"plan": fast_and_slow(2.0, 30), "dtype": "float32"}))
    out = run(
        "check",
        "--request",
        str(request),
        "--seed",
        "3",
        "--json",
        "--url",
        worker_server.url,
        env={"BATCHPLAN_API_KEY": API_KEY},
    )
    assert out.exit_code == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["status"] == "succeeded" and job["result"]["passed"] is True
    assert job["result"]["dtype"] == "float32" and job["result"]["split"] == "proportional"
    assert job["request"]["seed"] == 3


@pytest.mark.slow
def test_check_errors_on_a_server(run: Invoke, worker_server: Server) -> None:
    no_key = run("check", *PLAN, "--url", worker_server.url)
    assert no_key.exit_code == 2 and "API key" in no_key.stderr and "--api-key" in no_key.stderr
    infeasible = ["check", "--gpus-per-node", "2", "-b", "15", "-m", "4"]
    remote = run(*infeasible, *on(worker_server))
    local = run(*infeasible)
    assert remote.exit_code == local.exit_code == 2
    assert remote.stderr == local.stderr
    assert "try -b" in remote.stderr


@pytest.mark.slow
def test_client_check_lifecycle(worker_server: Server) -> None:
    body = {
        "plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8},
        "backend": "gloo",
    }
    with BatchplanClient(worker_server.url, api_key=API_KEY) as client:
        assert client.host()["ready"] is True
        job = client.submit_check(body)
        assert job["status"] in ("queued", "running")
        seen: list[str] = []
        done = client.wait_check(
            job["id"], timeout=30, poll=0.05, on_progress=lambda j, _: seen.append(j["status"])
        )
        assert done["status"] == "succeeded" and done["result"]["passed"] is True
        assert seen[-1] == "succeeded"
        assert job["id"] in [c["id"] for c in client.list_checks(limit=10)]
        with pytest.raises(ProblemError) as finished:
            client.cancel_check(job["id"])
        assert finished.value.status == 409
        with pytest.raises(ProblemError) as missing:
            client.get_check("no-such-check")
        assert missing.value.status == 404


@pytest.mark.slow
def test_host_command(run: Invoke, worker_server: Server) -> None:
    out = run("host", *on(worker_server))
    assert out.exit_code == 0, out.stderr
    host = json.loads(out.stdout)
    assert host["worker_enabled"] is True and "gloo" in host["backends"]


def test_check_against_a_server_without_the_worker(run: Invoke, server: Server) -> None:
    out = run("check", *PLAN, "--url", server.url)
    assert out.exit_code == 2
    assert "the worker is disabled on this server" in out.stderr


@pytest.mark.slow
def test_check_locally(run: Invoke) -> None:
    out = run("check", *PLAN, "--backend", "gloo", "--timeout", "60")
    assert out.exit_code == 0, out.stderr
    _assert_passed_output(out.stdout)
    assert out.stderr.startswith("local check (2 processes)")
    phases = _phases(out.stderr, re.escape("local check (2 processes)"))
    assert phases[0] == "starting 2 ranks" and phases[-1] == "succeeded"
    assert set(phases[1:-1]) <= {"running", "comparing on rank 0"}, phases


def test_local_check_validates_like_the_server(run: Invoke) -> None:
    out = run("check", *PLAN, "--timeout", "0")
    assert out.exit_code == 2 and out.stderr.startswith("error: --timeout: Input should be greater than 0")
    too_many = run("check", *PLAN, "--processes", "3")
    assert too_many.exit_code == 2 and "between 1 and the 2 replicas" in too_many.stderr


def test_exit_status_of_a_finished_check(capsys: pytest.CaptureFixture[str]) -> None:
    """0 when the plan held, 1 when the check ran and it did not, 2 when the check did not run.
    (A correct planner never fails a real check, so the 1 is shown on a result as the worker reports it.)"""
    result = {
        "passed": False,
        "backend": "gloo",
        "device": "cpu",
        "processes": 2,
        "data_parallel_size": 2,
        "replicas_per_process": 1,
        "max_abs_diff": 0.5,
        "rel_l2": 0.3,
        "tolerance": 1e-10,
        "controls": [{"name": "sum_without_scaling", "rel_l2": 7.0, "detected": True}],
        "timings_s": {},
    }
    job = {"id": "x", "status": "succeeded", "result": result, "error": None}
    assert show_check(job, as_json=False) == 1
    assert capsys.readouterr().out.startswith("FAILED: the DDP gradient does NOT match")
    assert show_check({**job, "result": {**result, "passed": True, "rel_l2": 0.0}}, as_json=False) == 0
    assert (
        show_check({"id": "x", "status": "failed", "result": None, "error": "rank died"}, as_json=True) == 2
    )
    assert "check x failed: rank died" in capsys.readouterr().err


def test_a_check_lists_the_controls_that_ran_and_those_skipped_with_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = {
        "passed": False,  # a control was missed
        "backend": "gloo",
        "device": "cpu",
        "processes": 2,
        "data_parallel_size": 2,
        "replicas_per_process": 1,
        "max_abs_diff": 0.0,
        "rel_l2": 1e-16,
        "tolerance": 1e-10,
        "controls": [
            {"name": "sum_without_scaling", "rel_l2": 7.0, "detected": True, "description": "sums"},
            {"name": "no_distributed_sampler", "rel_l2": 1e-12, "detected": False, "description": "same"},
            {"name": "sync_every_micro_batch", "rel_l2": None, "detected": True, "hung": True},
        ],
        "controls_skipped": [
            {"name": "unweighted_mean", "reason": "every replica has the same micro-batch"},
            {"name": "whole_global_batch", "reason": "one micro-step per replica"},
        ],
        "controls_not_applicable": ["unweighted_mean", "whole_global_batch"],
    }
    job = {"id": "x", "status": "succeeded", "result": result, "error": None}
    assert show_check(job, as_json=False) == 1
    lines = capsys.readouterr().out.splitlines()
    controls = lines[lines.index("controls (wrong setups the check must tell apart):") + 1 :]
    assert [line.split()[:2] for line in controls] == [
        ["detected", "sum_without_scaling"],
        ["MISSED", "no_distributed_sampler"],
        ["detected", "sync_every_micro_batch"],
        ["skipped", "unweighted_mean"],
        ["skipped", "whole_global_batch"],
    ]
    assert "rel_l2 7 " in controls[0] and "rel_l2 1e-12 " in controls[1]
    assert "hung (detected)" in controls[2]  # a hung control has no rel_l2
    assert controls[3].endswith("unweighted_mean              every replica has the same micro-batch")
    assert controls[4].endswith("one micro-step per replica")
    # A result from a worker without the reasons: the names, and that they did not apply.
    del result["controls_skipped"]
    show_check(job, as_json=False)
    assert "  skipped   whole_global_batch           does not apply to this plan" in capsys.readouterr().out


@pytest.mark.slow
def test_the_workload_flag_picks_what_runs_and_the_output_says_it(run: Invoke, worker_server: Server) -> None:
    """--workload over the plan's default: tokens on a plan normalised by samples (which the
    tokens check shows wrong on uneven lengths: exit 1), synthetic on one normalised by tokens."""
    server = on(worker_server)
    tokens = [
        "--gpus-per-node",
        "2",
        "--sequence-length",
        "16",
        "--global-batch-tokens",
        "128",
        "--micro-batch-tokens",
        "32",
    ]
    out = run("check", *tokens, "--workload", "tokens", *server)
    assert out.exit_code == 1, out.stderr
    assert "2 processes for 2 replicas (1 per process), workload tokens" in out.stdout
    assert re.search(r"^  detected +mean_per_micro_batch", out.stdout, re.MULTILINE), out.stdout
    out = run("check", *tokens, "--loss-normalization", "token", "--workload", "synthetic", *server, "--json")
    assert out.exit_code == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["request"]["workload"] == job["result"]["workload"] == "synthetic"
