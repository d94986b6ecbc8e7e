"""A field named as another tool names it, or put one level off, is told the field meant (issue
40, item 4): `base_learning_rate` gets `base_lr` as `global_batch` gets `global_batch_size`;
`gpus`, `nnodes`, `tp`, `train_batch_size`, `num_epochs` get theirs; a field that belongs one
level down (`num_nodes` beside `topology`, `global_batch_size` beside a check's `plan`) gets its
dotted place. Each hint is held to what it promises: the request with the hint applied is
accepted."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.fake_runner import FakeRunner

from app.main import create_app
from app.schemas.examples import plan_example
from app.settings import Settings

PLAN = plan_example("dataset_and_lr")
MEGATRON = plan_example("megatron")
CHECK = {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(jobs_db=tmp_path_factory.mktemp("jobs") / "jobs.sqlite3", log_level="warning")
    with TestClient(create_app(settings, runner=FakeRunner()), raise_server_exceptions=False) as test_client:
        yield test_client


def _at(body: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        body = body[part]
    return body


def _hint(client: TestClient, url: str, body: dict[str, Any], pointer: str) -> str:
    response = client.post(url, json=body)
    assert response.status_code == 422, response.text
    problem = response.json()
    [error] = [e for e in problem["errors"] if e["pointer"] == pointer]
    meant = re.search(r"did you mean `([^`]+)`\?$", error["detail"])
    assert meant, problem
    assert problem["errors"][0] == error, "the hint is the first error"
    return meant.group(1)


SYNONYMS = [
    ("/v1/plans", PLAN, ("learning_rate",), "base_lr", "base_learning_rate"),
    ("/v1/plans", PLAN, ("learning_rate",), "base_lr", "lr"),
    ("/v1/plans", PLAN, ("learning_rate",), "base_lr", "learning_rate"),
    ("/v1/plans", PLAN, ("topology",), "gpus_per_node", "gpus"),
    ("/v1/plans", PLAN, ("topology",), "num_nodes", "nnodes"),
    ("/v1/plans", PLAN, (), "global_batch_size", "train_batch_size"),
    ("/v1/plans", PLAN, ("dataset",), "epochs", "num_epochs"),
    ("/v1/plans", MEGATRON, ("parallelism",), "tensor", "tp"),
    ("/v1/plans", MEGATRON, ("parallelism",), "pipeline", "pipeline_model_parallel_size"),
    ("/v1/plans/export/torchrun", PLAN, ("topology",), "gpus_per_node", "nproc_per_node"),
    ("/v1/checks", CHECK, ("plan", "topology"), "gpus_per_node", "gpus"),
]


@pytest.mark.parametrize(("url", "body", "path", "right", "wrong"), SYNONYMS)
def test_another_tools_name_for_a_field_names_the_field(
    client: TestClient, url: str, body: dict[str, Any], path: tuple[Any, ...], right: str, wrong: str
) -> None:
    changed = copy.deepcopy(body)
    holder = _at(changed, path)
    holder[wrong] = holder.pop(right)
    pointer = "/" + "/".join(str(p) for p in (*path, wrong))
    assert _hint(client, url, changed, pointer) == right
    holder[right] = holder.pop(wrong)
    assert 200 <= client.post(url, json=changed).status_code < 300


# (url, body, the object a field belongs in, the field): the field is sent one or two levels up.
MISPLACED = [
    ("/v1/plans", PLAN, ("topology",), "num_nodes"),
    ("/v1/plans", PLAN, ("learning_rate",), "warmup_epochs"),
    ("/v1/plans", PLAN, ("dataset",), "num_samples"),
    ("/v1/plans", MEGATRON, ("parallelism",), "tensor"),
    ("/v1/checks", CHECK, ("plan",), "global_batch_size"),
    ("/v1/checks", CHECK, ("plan", "topology"), "num_nodes"),
]


@pytest.mark.parametrize(("url", "body", "path", "field"), MISPLACED)
def test_a_field_sent_outside_its_object_names_its_place(
    client: TestClient, url: str, body: dict[str, Any], path: tuple[Any, ...], field: str
) -> None:
    changed = copy.deepcopy(body)
    changed[field] = _at(changed, path).pop(field)
    assert _hint(client, url, changed, f"/{field}") == ".".join((*path, field))
    _at(changed, path)[field] = changed.pop(field)
    assert 200 <= client.post(url, json=changed).status_code < 300


def test_a_field_like_no_known_one_still_gets_no_guess(client: TestClient) -> None:
    problem = client.post("/v1/plans", json={**PLAN, "colour": "blue"}).json()
    assert problem["errors"] == [{"pointer": "/colour", "detail": "Extra inputs are not permitted"}]
