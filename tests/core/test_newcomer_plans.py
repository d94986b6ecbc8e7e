"""Words in plans and exports that a newcomer read wrong (issue 25): the DataParallel sentence
under accumulation, the torchrun script's environment note, and runs too long to be real."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
from export_helpers import export_input

from app.core.exports.parts.export_types import ExportOptions
from app.core.exports.registry import export
from app.core.planner import plan
from app.core.records.plan import Plan
from app.core.records.plan_request import MAX_SAFE_INTEGER
from app.schemas.examples import PLAN_EXAMPLES
from app.schemas.plan_requests import PlanRequestIn


def _plan(body: dict[str, Any]) -> Plan:
    return plan(PlanRequestIn.model_validate(body).to_core())


EVEN_EXAMPLES = [name for name in PLAN_EXAMPLES if not name.startswith("mixed")]  # mixed: uneven splits


@pytest.mark.parametrize("name", EVEN_EXAMPLES)
def test_the_data_parallel_sentence_calls_the_global_batch_only_the_global_batch(name: str) -> None:
    planned = _plan(PLAN_EXAMPLES[name]["value"])
    [sentence] = [s for s in planned.explanation if "Under DataParallel" in s]
    loader = sentence.split("Under DataParallel", 1)[1]
    micro, dp, g = planned.micro_batch_size, planned.data_parallel_size, planned.gradient_accumulation_steps
    assert micro is not None
    if g == 1:
        assert loader.endswith(f"the whole batch per step, {planned.global_batch_size}.")
        return
    # DataParallel's loader batch is one micro-step on every GPU; accumulation makes the global batch.
    said = re.search(
        r"batch_size is one micro-step's batch, (\d+) x (\d+) = (\d+), and (\d+) accumulated", loader
    )
    assert said, sentence
    assert [int(v) for v in said.groups()] == [micro, dp, micro * dp, g]
    assert f"the global batch of {planned.global_batch_size}" in loader
    assert "whole batch" not in loader


def test_the_token_example_has_accumulation_so_the_sentence_is_tested_with_it() -> None:
    assert any(_plan(PLAN_EXAMPLES[n]["value"]).gradient_accumulation_steps > 1 for n in EVEN_EXAMPLES)


@pytest.mark.parametrize("num_nodes", [1, 2])
@pytest.mark.parametrize("setup", [None, "source /opt/venv/bin/activate"])
def test_a_torchrun_script_never_talks_about_sbatch(num_nodes: int, setup: str | None) -> None:
    x = export_input({"topology": {"num_nodes": num_nodes, "gpus_per_node": 8}, "global_batch_size": 512})
    options = ExportOptions(setup=setup)
    text = export("torchrun", type(x)(x.request, x.plan, options)).text
    assert "sbatch" not in text and "--export=NONE" not in text
    if setup:
        assert setup in text.splitlines()
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    if not setup:  # the Slurm script, which does run under sbatch, keeps saying why
        assert "sbatch --export=NONE" in export("slurm", type(x)(x.request, x.plan, options)).text


def test_an_accumulation_beyond_any_real_run_is_a_warning() -> None:
    body = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 4_500_000_000_000_000}
    planned = _plan({**body, "max_micro_batch_size": 64})
    g = planned.gradient_accumulation_steps
    assert g > 10**12
    [warning] = [w for w in planned.warnings if "beyond any real run" in w]
    assert warning.startswith(f"gradient_accumulation_steps {g} is beyond any real run")
    assert "years" in warning
    # Without the cap the same batch runs in one micro-step per replica: nothing to warn about.
    assert not [w for w in _plan(body).warnings if "beyond any real run" in w]


def test_optimizer_steps_beyond_any_real_run_are_a_warning() -> None:
    body = {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "global_batch_size": 16,
        "dataset": {"num_samples": MAX_SAFE_INTEGER, "shuffle": False},
    }
    planned = _plan(body)
    assert planned.sampler is not None
    steps = planned.sampler.optimizer_steps_per_epoch
    assert (
        [w for w in planned.warnings if "beyond any real run" in w]
        == [
            w
            for w in planned.warnings
            if w.startswith(f"{steps} optimizer steps in one epoch is beyond any real run")
        ]
        != []
    )
    with_epochs = _plan({**body, "dataset": {**body["dataset"], "epochs": 3}})
    assert with_epochs.sampler is not None and with_epochs.sampler.total_optimizer_steps == 3 * steps
    assert any(w.startswith(f"{3 * steps} optimizer steps in the run") for w in with_epochs.warnings)


@pytest.mark.parametrize("name", list(PLAN_EXAMPLES))
def test_real_plans_are_never_told_they_are_beyond_a_real_run(name: str) -> None:
    assert not [w for w in _plan(PLAN_EXAMPLES[name]["value"]).warnings if "beyond any real run" in w]
