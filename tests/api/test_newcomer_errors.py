"""Bad input that says what to send instead (issue 25): a misspelt field names the field meant,
at every depth; a number sent as a string says to send a JSON number; an empty body says it
is empty; a wrong method says which to use. Each hint is held to what it promises: the request
with the hint applied is accepted."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.fake_runner import FakeRunner

from app.main import create_app
from app.schemas.elastic import ELASTIC_REQUEST_EXAMPLE
from app.schemas.examples import plan_example
from app.schemas.exports import SCHEDULE_REQUEST_EXAMPLE
from app.settings import Settings

PLAN = plan_example("dataset_and_lr")
CHECK = {"plan": {"topology": {"num_nodes": 1, "gpus_per_node": 2}, "global_batch_size": 8}}
MIXED = plan_example("mixed")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server whose checks run on the fake runner: the check body is validated as served."""
    settings = Settings(jobs_db=tmp_path_factory.mktemp("jobs") / "jobs.sqlite3", log_level="warning")
    with TestClient(create_app(settings, runner=FakeRunner()), raise_server_exceptions=False) as test_client:
        yield test_client


def _at(body: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    node: Any = body
    for part in path:
        node = node[part]
    return node  # type: ignore[no-any-return]


def _misspelt(body: dict[str, Any], path: tuple[Any, ...], right: str, wrong: str) -> dict[str, Any]:
    """`body` with the field `right` of the object at `path` renamed to `wrong`."""
    changed = copy.deepcopy(body)
    holder = _at(changed, path)
    holder[wrong] = holder.pop(right)
    return changed


# (url, a valid body, where the object is, a field it has, the misspelling): one per depth.
MISSPELLINGS = [
    ("/v1/plans", PLAN, (), "global_batch_size", "global_batch"),
    ("/v1/plans", PLAN, ("topology",), "gpus_per_node", "gpu_per_node"),
    ("/v1/plans", MIXED, ("topology", "node_groups", 1), "relative_throughput", "relative_thruput"),
    ("/v1/plans", PLAN, ("dataset",), "num_samples", "num_sample"),
    ("/v1/plans", PLAN, ("learning_rate",), "warmup_epochs", "warmup_epoch"),
    ("/v1/plans", plan_example("megatron"), ("parallelism",), "pipeline", "pipelines"),
    ("/v1/plans/export/torchrun", PLAN, ("topology",), "num_nodes", "num_node"),
    ("/v1/plans/schedule", SCHEDULE_REQUEST_EXAMPLE, ("rampup",), "rampup_samples", "ramp_up_samples"),
    ("/v1/plans/schedule", SCHEDULE_REQUEST_EXAMPLE, ("plan", "dataset"), "epochs", "epoch"),
    ("/v1/plans/elastic", ELASTIC_REQUEST_EXAMPLE, (), "micro_batch_sizes", "micro_batch_size"),
    ("/v1/checks", {**CHECK, "dtype": "float64"}, (), "dtype", "dtyp"),
    ("/v1/checks", CHECK, ("plan", "topology"), "num_nodes", "nodes"),
]


@pytest.mark.parametrize(("url", "body", "path", "right", "wrong"), MISSPELLINGS)
def test_a_misspelt_field_names_the_field_meant(
    client: TestClient, url: str, body: dict[str, Any], path: tuple[Any, ...], right: str, wrong: str
) -> None:
    assert 200 <= client.post(url, json=body).status_code < 300
    response = client.post(url, json=_misspelt(body, path, right, wrong))
    assert response.status_code == 422, response.text
    problem = response.json()
    pointer = "/" + "/".join(str(p) for p in (*path, wrong))
    [error] = [e for e in problem["errors"] if e["pointer"] == pointer]
    meant = re.search(r"did you mean `([^`]+)`\?$", error["detail"])
    assert meant, error
    # The misspelling is the first error, even where the field meant also shows as missing.
    assert problem["errors"][0] == error and problem["detail"] == f"{pointer}: {error['detail']}"
    # Renaming the field as the hint says makes the request valid again.
    fixed = _misspelt(_misspelt(body, path, right, wrong), path, wrong, meant.group(1))
    assert 200 <= client.post(url, json=fixed).status_code < 300


def test_a_field_like_no_known_one_gets_no_guess(client: TestClient) -> None:
    problem = client.post("/v1/plans", json={**PLAN, "colour": "blue"}).json()
    assert problem["errors"] == [{"pointer": "/colour", "detail": "Extra inputs are not permitted"}]


@pytest.mark.parametrize(
    ("path", "field"),
    [((), "global_batch_size"), (("topology",), "num_nodes"), (("dataset",), "num_samples")],
)
def test_a_number_sent_as_a_string_says_to_send_a_json_number(
    client: TestClient, path: tuple[str, ...], field: str
) -> None:
    body = copy.deepcopy(PLAN)
    value = _at(body, path)[field]
    _at(body, path)[field] = str(value)
    problem = client.post("/v1/plans", json=body).json()
    [error] = problem["errors"]
    assert error["pointer"] == "/" + "/".join((*path, field))
    assert "a JSON number, not a string" in error["detail"]
    assert f'send {value}, not "{value}"' in error["detail"]
    _at(body, path)[field] = int(error["detail"].split("send ")[1].split(",")[0])
    assert client.post("/v1/plans", json=body).status_code == 200


def test_a_boolean_count_says_to_send_a_number(client: TestClient) -> None:
    problem = client.post("/v1/plans", json={**PLAN, "global_batch_size": True}).json()
    assert problem["errors"][0]["detail"].endswith("a JSON number, not true")


@pytest.mark.parametrize("url", ["/v1/plans", "/v1/plans/export/slurm", "/v1/plans/schedule", "/v1/checks"])
def test_an_empty_body_says_the_body_is_empty(client: TestClient, url: str) -> None:
    response = client.post(url, content=b"", headers={"content-type": "application/json"})
    assert response.status_code == 422
    problem = response.json()
    assert problem["detail"].startswith("the body is empty")
    assert problem["errors"] == [{"pointer": "", "detail": problem["detail"]}]


@pytest.mark.parametrize(
    ("method", "url"),
    [("GET", "/v1/plans"), ("PUT", "/v1/plans"), ("GET", "/v1/plans/elastic"), ("PUT", "/v1/checks/abc")],
)
def test_a_wrong_method_says_which_to_use(client: TestClient, method: str, url: str) -> None:
    response = client.request(method, url)
    assert response.status_code == 405
    named = re.fullmatch(r"\w+ is not served at (\S+); use (.+)", response.json()["detail"])
    assert named, response.json()
    methods = named.group(2).split(" or ")
    assert response.headers["allow"] == ", ".join(methods)
    # The methods named are exactly those served at that path (Starlette's own Allow header
    # names the first route's only: GET of a check, not DELETE).
    served = [
        m for m in ("DELETE", "GET", "PATCH", "POST", "PUT") if client.request(m, url).status_code != 405
    ]
    assert methods == served
