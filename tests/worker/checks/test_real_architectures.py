"""Real architectures, tiny and random-init, checked as an operator registers them: a ResNet
with batch norm (train, eval, GroupNorm, SyncBatchNorm), a ConvNeXt with drop path, and
Transformers' GPT-2, Llama and BERT with dict batches and their own loss.

Most checks run in this process on a real gloo process group of one process that runs all
four replicas under DDP (transformers is imported once, here, not in every rank); what
needs the service (a 422 at submission, errors in the job, warm ranks kept, the model list)
runs on warm ranks over HTTP.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from fastapi.testclient import TestClient
from support.apps import warm_app, warm_client
from support.one_rank import one_rank_group
from support.polling import run_check
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from app.contract.codec import encode
from app.contract.request import build_spec, check_request
from app.worker.checks import equivalence_probes
from app.worker.checks.driver import run_spec
from app.worker.checks.result_parts import CheckGroup
from app.worker.measure.memory import probe
from app.worker.training.sync_batch_norm import as_batch_norm
from app.worker.training.workload import Registered, raised_by_model
from app.worker.zoo import example_architectures, example_models

pytestmark = pytest.mark.slow

ARCH = "app.worker.example_architectures"
HF = "app.worker.example_hf_models"
FOUR = {"topology": {"num_nodes": 1, "gpus_per_node": 4}, "global_batch_size": 32, "micro_batch_size": 4}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    # One thread, as the warm ranks run: tiny convolutions on a shared, busy host are many
    # times slower with a thread pool.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with one_rank_group():
            yield
    finally:
        torch.set_num_threads(threads)


@functools.cache
def workload(target: str) -> Registered:
    return Registered(target.rpartition(":")[2], target)


def check_here(target: str, noise_steps: int = 0) -> dict[str, Any]:
    """The check of `target` at FOUR's split, on the gloo group of this process."""
    built = workload(target)
    request = {"plan": FOUR, "model": built.name, "noise_scale": {"steps": noise_steps}}
    spec = dataclasses.replace(build_spec(check_request(request)), model=built.name)
    result = run_spec(spec, CheckGroup(0, 1, CPU, "gloo"), built, None)
    assert result is not None
    return encode(result)


def findings(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["cause"]: f for f in result["ddp_equivalence"]["findings"]}


# ----------------------------------------------------------------- modes (defect 1)


def test_batch_norms_the_factory_put_in_eval_mode_stay_there_and_are_no_finding(group: None) -> None:
    frozen = workload(f"{ARCH}:resnet_frozen_bn")
    assert not any(m.training for m in frozen.template.modules() if isinstance(m, nn.BatchNorm2d))
    result = check_here(f"{ARCH}:resnet_frozen_bn")
    assert result["gradient_matches"] and result["ddp_equivalence"]["equivalent"]
    assert "batch_norm" not in findings(result)
    # The other fix the finding names: GroupNorm.
    assert check_here(f"{ARCH}:resnet_group_norm")["ddp_equivalence"]["equivalent"]
    # And in training mode the finding stands, saying what the usual recipe costs.
    trained = check_here(f"{ARCH}:resnet")
    batch_norm = findings(trained)["batch_norm"]
    assert not trained["gradient_matches"] and batch_norm["breaks_equivalence"]
    assert batch_norm["modules"][0] == "stem.1"
    assert "common, accepted recipe" in batch_norm["detail"] and batch_norm["fix"].startswith("nothing, if")


def test_gpt2_with_dropout_off_where_it_is_drawn_is_equivalent(group: None) -> None:
    with_dropout = findings(check_here(f"{HF}:gpt2_with_dropout"))
    assert "transformer.h.0.attn.attn_dropout" in with_dropout["dropout"]["modules"]
    # GPT-2's attention passes its rate to the kernel while the attention module trains:
    # the module whose forward drew the numbers is named, beside the Dropout modules.
    assert with_dropout["stochastic_forward"]["modules"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    fixed = check_here(f"{HF}:gpt2_eval_dropout")
    assert fixed["passed"] and fixed["ddp_equivalence"]["equivalent"]
    assert not {"dropout", "stochastic_forward"} & set(findings(fixed))


# ----------------------------------------------------------------- randomness (defect 2)


def test_stochastic_depth_behind_a_tiny_layer_scale_is_found_and_named(group: None) -> None:
    built = workload(f"{ARCH}:convnext")
    module = built.module(torch.float64, CPU)
    x, _ = built.batch(range(8), torch.float64, CPU)
    output_spread = equivalence_probes.stochastic_forward(lambda: module(x), CPU)
    # The output alone moves by less than a fixed 1e-6 would call random...
    assert 0 < output_spread < 1e-6
    result = check_here(f"{ARCH}:convnext")
    found = findings(result)
    assert "unexplained" not in found and found["stochastic_depth"]["breaks_equivalence"]
    assert found["stochastic_depth"]["modules"] == ["stages.0.drop_path", "stages.1.drop_path"]
    assert "drop-path rate at 0" in found["stochastic_depth"]["fix"]
    # ...and without drop path the same blocks are equivalent.
    module.eval()
    assert equivalence_probes.stochastic_forward(lambda: module(x), CPU) == 0


def test_functional_attention_dropout_names_the_attention_module(group: None) -> None:
    result = check_here(f"{HF}:llama")
    stochastic = findings(result)["stochastic_forward"]
    assert stochastic["modules"] == ["model.layers.0.self_attn"]
    assert "model.layers.0.self_attn" in stochastic["detail"]
    assert not result["ddp_equivalence"]["equivalent"]


# ----------------------------------------------------------------- noise scale (defect 3)


def test_a_batch_norm_models_noise_scale_is_withheld(group: None) -> None:
    noise = check_here(f"{ARCH}:resnet", noise_steps=8)["noise_scale"]
    assert noise["b_simple"] is not None  # measured, and shown
    assert noise["reliable"] is False
    assert noise["critical_batch_size"] is None and noise["efficiency"] is None
    assert any("not DDP-equivalent" in reason for reason in noise["unreliable_because"])
    assert noise["recommendation"].startswith("no recommendation")


# ----------------------------------------------------------------- Hugging Face (defect 5)


def test_transformers_models_train_on_dict_batches_with_their_own_loss(group: None) -> None:
    for name in ("gpt2", "bert"):
        result = check_here(f"{HF}:{name}")
        assert result["passed"], (name, result["ddp_equivalence"])
        tokens = findings(result)["loss_over_tokens"]
        assert tokens["breaks_equivalence"] is False
    built = workload(f"{HF}:gpt2")
    x, y = built.batch([0, 1], None, CPU)
    # The loss is the model's own, computed by transformers from the labels.
    reference = built.template(**x).loss
    assert torch.equal(built.loss(built.template, x, y, "mean"), reference)
    # The memory probe takes the same batches.
    peak, error = probe(built.module(None, CPU), built.dataset, built.loss_fn, 4, CPU)
    assert error is None and peak > 0


# ----------------------------------------------------------------- SyncBatchNorm (defect 4)


def test_sync_batch_norm_as_batch_norm_is_the_same_function() -> None:
    torch.manual_seed(0)
    plain = example_architectures.ResNet(nn.BatchNorm2d).double()
    synced: nn.Module = nn.SyncBatchNorm.convert_sync_batchnorm(  # type: ignore[no-untyped-call]
        example_architectures.ResNet(nn.BatchNorm2d).double()
    )
    synced.load_state_dict(plain.state_dict())
    back = as_batch_norm(synced)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in back.modules())
    assert any(isinstance(m, nn.SyncBatchNorm) for m in synced.modules())  # a copy was converted
    x = torch.randn(6, 3, 8, 8, dtype=torch.float64)
    plain(x).sum().backward()
    back(x).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), back.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-14), name  # type: ignore[arg-type]
    assert torch.equal(plain.stem[1].running_mean, back.stem[1].running_mean)  # type: ignore[index]


def test_sync_batch_norm_on_cpu_is_refused_before_any_collective(group: None) -> None:
    with pytest.raises(ValueError, match="SyncBatchNorm layer") as refused:
        check_here(f"{ARCH}:resnet_sync_bn")
    assert raised_by_model(refused.value)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="SyncBatchNorm needs 2 GPUs"
)
def test_sync_batch_norm_is_equivalent_on_gpus(tmp_path: Path) -> None:
    registry = f"sync={ARCH}:resnet_sync_bn"
    plan = {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 16}
    with warm_app(tmp_path / "jobs.sqlite3", 2, models=True, check_models=registry) as client:
        body = {"plan": plan, "model": "sync", "backend": "nccl", "noise_scale": {"steps": 0}}
        job = run_check(client, body)
    result = job["result"]
    assert result["gradient_matches"] and result["ddp_equivalence"]["equivalent"], result
    assert "nothing" in findings(result)["batch_norm"]["fix"]


# ----------------------------------------------------------------- unused parameters (defect 7)


def test_unused_parameters_fail_ddps_default_at_the_next_step_as_the_finding_says(group: None) -> None:
    finding = findings(check_here("app.worker.example_models:unused_parameter_mlp"))["unused_parameters"]
    assert finding["fails_with_ddp_defaults"] and not finding["breaks_equivalence"]
    model, data, loss = example_models.unused_parameter_mlp()
    ddp = DistributedDataParallel(model)
    x, y = data[0:8]
    loss(ddp(x), y).backward()
    with pytest.raises(RuntimeError, match="Expected to have finished reduction in the prior iteration"):
        loss(ddp(x), y).backward()


# ----------------------------------------------------------------- over HTTP (defects 4, 6)

SERVED = ["resnet_sync_bn", "fixed_batch", "wrong_head"]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    registry = ",".join(f"{name}={ARCH}:{name}" for name in SERVED)
    yield from warm_client(tmp_path_factory, 2, models=True, log_level="warning", check_models=registry)


def test_a_model_that_fails_on_two_samples_is_not_loaded_and_says_why(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v1/check-models").json()["models"]}
    assert models["fixed_batch"]["loaded"] is True  # two samples are what it was written for
    wrong = models["wrong_head"]
    assert wrong["loaded"] is False
    assert "a forward and backward pass on two samples failed" in wrong["error"]
    assert "mat1 and mat2 shapes cannot be multiplied" in wrong["error"]
    response = client.post("/v1/checks", json={"plan": FOUR, "model": "wrong_head"})
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/model"


def test_sync_batch_norm_on_a_cpu_worker_is_a_422_at_submission(client: TestClient) -> None:
    response = client.post("/v1/checks", json={"plan": FOUR, "model": "resnet_sync_bn"})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["errors"][0]["pointer"] == "/model"
    assert "SyncBatchNorm" in problem["detail"] and "GPU" in problem["detail"]


def test_a_models_exception_gives_its_traceback_and_keeps_the_ranks(client: TestClient) -> None:
    before = sorted(p["pid"] for p in client.get("/v1/host").json()["processes"])
    job = run_check(client, {"plan": FOUR, "model": "fixed_batch"}, timeout=120)
    assert job["status"] == "failed"
    error = job["error"]
    assert "Traceback (the model's frames)" in error
    assert "example_architectures.py" in error and "x.view(2, 3 * SIZE * SIZE)" in error
    assert "rank_server.py" not in error and "ddp_check.py" not in error  # the worker's frames are cut
    assert "the check's ranks were kept" in error
    after = sorted(p["pid"] for p in client.get("/v1/host").json()["processes"])
    assert after == before
    # The kept ranks run the next check.
    assert run_check(client, {"plan": FOUR}, timeout=120)["result"]["passed"]
