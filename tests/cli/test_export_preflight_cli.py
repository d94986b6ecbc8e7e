"""The preflight option of the launch exports: on by default in the CLI and the API, the same
text written here or by a server, off with --no-preflight / preflight=false, and a bad model
factory refused naming the field."""

from __future__ import annotations

import pytest
from support.cli import Invoke
from support.servers import Server

ARGS = ["--num-nodes", "2", "--gpus-per-node", "4", "-b", "64"]
MARK = "-m app.worker.gradcheck"


@pytest.mark.parametrize("fmt", ["slurm", "torchrun", "kubernetes"])
def test_preflight_is_on_by_default_and_off_with_a_flag(run: Invoke, server: Server, fmt: str) -> None:
    for flags, expected in (([], True), (["--no-preflight"], False), (["--preflight"], True)):
        local = run("export", fmt, *ARGS, *flags)
        remote = run("export", fmt, *ARGS, *flags, "--url", server.url)
        assert local.exit_code == remote.exit_code == 0, (local.stderr, remote.stderr)
        assert local.stdout == remote.stdout
        assert (MARK in local.stdout) is expected


def test_the_model_factory_and_setup_reach_the_script(run: Invoke, server: Server) -> None:
    flags = [
        "--model-factory",
        "mypkg.models:build",
        "--setup",
        "source /v/bin/activate",
        "--cpus-per-gpu",
        "2",
    ]
    out = run("export", "slurm", *ARGS, *flags, "--url", server.url)
    assert out.exit_code == 0, out.stderr
    assert "--model-factory mypkg.models:build" in out.stdout
    assert "\nsource /v/bin/activate\n" in out.stdout and "#SBATCH --cpus-per-task=8" in out.stdout


def test_a_model_factory_that_is_not_module_colon_name_is_refused(run: Invoke, server: Server) -> None:
    for extra in ([], ["--url", server.url]):
        out = run("export", "slurm", *ARGS, "--model-factory", "not a factory", *extra)
        assert out.exit_code != 0 and "--model-factory" in out.stderr, out.stderr  # the flag typed
    response = server.client.post(
        "/v1/plans/export/slurm",
        params={"setup": "a\nb"},
        json={"topology": {"num_nodes": 1, "gpus_per_node": 1}},
    )
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"
    assert "setup" in response.text
