"""CI runs the suite on pytest-xdist workers (.ci/run runs the README's test command): tests
that share a module or session fixture, or carry one xdist_group name, run on one worker and
set the fixture up once (tests/support/parallel.py), and the units go to different workers.
Checked on a small suite of its own, run by a real `pytest -n 3`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[2]

SUITE = {
    "pytest.ini": "[pytest]\nmarkers =\n    slow: a slow test\n",
    "recorder.py": """
import os, time

def record(what: str) -> None:
    with open(os.environ["RECORD"], "a") as out:
        out.write(f"{what} {os.environ['PYTEST_XDIST_WORKER']}\\n")
    time.sleep(0.2)  # long enough that an idle worker would take the next test
""",
    "conftest.py": """
import pytest
from recorder import record

pytest_plugins = ("support.parallel",)

@pytest.fixture(scope="session")
def cluster():
    record("cluster-setup")
    yield
""",
    "test_pool.py": """
import pytest
from recorder import record

@pytest.fixture(scope="module")
def pool():
    record("pool-setup")
    yield

@pytest.fixture
def job(pool):  # the module fixture reached through another fixture
    return pool

@pytest.mark.parametrize("i", range(4))
def test_with_the_pool(pool, i):
    record("pool-test")

@pytest.mark.parametrize("i", range(2))
def test_with_a_job(job, i):
    record("pool-test")

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    record("alone")
""",
    "test_cluster_a.py": """
import pytest
from recorder import record

@pytest.mark.slow
@pytest.mark.parametrize("i", range(3))
def test_a(cluster, i):
    record("cluster-test")
""",
    "test_cluster_b.py": """
import pytest
from recorder import record

@pytest.mark.parametrize("i", range(3))
def test_b(cluster, i):
    record("cluster-test")
""",
    "test_marked.py": """
import pytest
from recorder import record

@pytest.mark.xdist_group("one-file")
@pytest.mark.parametrize("i", range(3))
def test_marked(i):
    record("marked")

@pytest.mark.parametrize("i", range(3))
@pytest.mark.xdist_group(name="one-file")
def test_marked_too(i):
    record("marked")
""",
}


def test_tests_sharing_a_fixture_or_a_group_run_on_one_worker_and_units_spread(tmp_path: Path) -> None:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    record = tmp_path / "record.txt"
    env = {**os.environ, "RECORD": str(record), "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "24 passed" in done.stdout, done.stdout
    workers: dict[str, list[str]] = defaultdict(list)
    for line in record.read_text().splitlines():
        what, worker = line.split()
        workers[what].append(worker)
    assert len(workers["pool-setup"]) == 1 and len(workers["cluster-setup"]) == 1, dict(workers)
    for shared in ("pool-test", "cluster-test", "marked"):
        assert len(set(workers[shared])) == 1, (shared, dict(workers))
    assert workers["pool-test"][0] == workers["pool-setup"][0]
    assert workers["cluster-test"][0] == workers["cluster-setup"][0]
    # Three units and three workers: each worker starts on one of them.
    assert len({workers["pool-test"][0], workers["cluster-test"][0], workers["marked"][0]}) == 3


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("Test it (") :]
    block = block[block.index("```sh\n") + len("```sh\n") :]
    command = block[: block.index("\n```")]
    *install, test = command.split(" && ")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, (test, "is not a line of .ci/run")
    assert ci.index(test) == len(ci) - 1  # the last: pytest's summary line closes CI's output
    # .ci/run's install is the README's, quiet and without pip's up-front bytecode compile;
    # run by uv where uv can be had, for the same packages.
    quiet = [line.strip().replace(" -q ", " ").replace(" --no-compile ", " ") for line in ci]
    assert install[-1] in quiet, (install, "is not .ci/run's")
    asked = install[-1].split(" install ", 1)[1]
    assert any(line.strip().endswith(f'"${{where[@]}}" {asked}') for line in ci), (
        asked,
        "uv asks for other packages",
    )
