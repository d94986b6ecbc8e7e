"""POST /v1/plans/export/{format}, /v1/plans/schedule and /v1/plans/elastic over HTTP."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from app.core.exports.registry import EXPORTERS
from app.schemas.examples import PLAN_EXAMPLES as EXAMPLES

PLAN = EXAMPLES["dataset_and_lr"]["value"]
MIXED = EXAMPLES["mixed"]["value"]
PROBLEM = "application/problem+json"


@pytest.mark.parametrize("fmt", list(EXPORTERS))
def test_every_format_answers_with_its_media_type(client: TestClient, fmt: str) -> None:
    # torchtitan builds Adam only: the ImageNet recipe (SGD) is refused, the language model's is not.
    body = EXAMPLES["language_model"]["value"] if fmt == "torchtitan" else PLAN
    response = client.post(f"/v1/plans/export/{fmt}", json=body)
    assert response.status_code == 200, response.text
    media = response.headers["content-type"].split(";")[0]
    if media == "application/json":
        json.loads(response.text)
    elif media == "application/yaml":
        yaml.safe_load(response.text)
    elif media == "application/toml":
        tomllib.loads(response.text)
    else:
        assert media == "text/plain"
    assert "filename=" in response.headers["content-disposition"]


def test_unknown_format_is_404_listing_the_known_ones(client: TestClient) -> None:
    response = client.post("/v1/plans/export/ray", json=PLAN)
    assert response.status_code == 404
    assert response.headers["content-type"] == PROBLEM
    detail = response.json()["detail"]
    assert all(fmt in detail for fmt in EXPORTERS)


def test_uneven_plan_in_a_single_batch_format_is_422_with_the_even_alternative(client: TestClient) -> None:
    response = client.post("/v1/plans/export/deepspeed", json=MIXED)
    assert response.status_code == 422 and response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["type"].endswith("export-unsupported")
    assert body["errors"][0]["pointer"] == "/topology/node_groups"
    # The micro-batch alone evens the split: the global batch sent is not suggested back.
    assert body["suggestions"] == {"micro_batch_size": [25, 10, 5], "gradient_accumulation_steps": [50]}
    for field, values in body["suggestions"].items():
        for value in values:
            fixed = client.post("/v1/plans/export/deepspeed", json={**MIXED, field: value})
            assert fixed.status_code == 200, (field, value, fixed.text)


def test_changes_that_work_only_together_are_combined_suggestions(client: TestClient) -> None:
    uneven = {**MIXED, "global_batch_size": 1001}
    body = client.post("/v1/plans/export/hf-trainer", json=uneven).json()
    assert body["type"].endswith("export-unsupported") and "suggestions" not in body
    assert body["combined_suggestions"][0] == {"global_batch_size": 1000, "micro_batch_size": 25}
    for change in body["combined_suggestions"]:
        assert client.post("/v1/plans/export/hf-trainer", json={**uneven, **change}).status_code == 200
        for field, value in change.items():
            alone = client.post("/v1/plans/export/hf-trainer", json={**uneven, field: value})
            assert alone.status_code == 422, (field, value)


def test_export_options_are_validated_and_used(client: TestClient) -> None:
    response = client.post("/v1/plans/export/kubernetes?job_name=Bad_Name", json=PLAN)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/query/job_name"
    ok = client.post("/v1/plans/export/kubernetes?job_name=resnet&image=my.reg/img:1", json=PLAN)
    manifest = yaml.safe_load(ok.text)
    assert manifest["metadata"]["name"] == "resnet"
    assert manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "image"
    ] == ("my.reg/img:1")


def test_infeasible_plan_is_the_planners_422(client: TestClient) -> None:
    body = {**PLAN, "global_batch_size": 1000, "micro_batch_size": 32}
    response = client.post("/v1/plans/export/torchrun", json=body)
    assert response.status_code == 422 and response.json()["suggestions"]


def test_export_needs_json(client: TestClient) -> None:
    response = client.post("/v1/plans/export/torchrun", content="x", headers={"content-type": "text/plain"})
    assert response.status_code == 400


SCHEDULE: dict[str, Any] = {
    "plan": {**PLAN, "micro_batch_size": 16},
    "rampup": {"start_batch_size": 256, "batch_size_increment": 256, "rampup_samples": 3_000_000},
    "max_points": 200,
}


def test_schedule_series(client: TestClient) -> None:
    response = client.post("/v1/plans/schedule", json=SCHEDULE)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["points"]) <= 200 and body["downsampled"]
    assert [s["global_batch_size"] for s in body["stages"]] == [256, 512]
    assert body["points"][0]["lr"] == 0.1 and body["peak_lr"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("fmt", "media", "magic"), [("png", "image/png", b"\x89PNG"), ("svg", "image/svg+xml", b"<?xml")]
)
def test_schedule_chart(client: TestClient, fmt: str, media: str, magic: bytes) -> None:
    response = client.post(f"/v1/plans/schedule?format={fmt}", json=SCHEDULE)
    assert response.status_code == 200
    assert response.headers["content-type"] == media and response.content.startswith(magic)


def test_schedule_errors_point_into_the_body(client: TestClient) -> None:
    bad_ramp = {**SCHEDULE, "rampup": {**SCHEDULE["rampup"], "start_batch_size": 100}}
    response = client.post("/v1/plans/schedule", json=bad_ramp)
    assert (
        response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/rampup/start_batch_size"
    )
    bad_plan = {**SCHEDULE, "plan": {**SCHEDULE["plan"], "micro_batch_size": 1000}}
    response = client.post("/v1/plans/schedule", json=bad_plan)
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"].startswith("/plan/")
    response = client.post("/v1/plans/schedule?format=gif", json=SCHEDULE)
    assert response.status_code == 422


def test_elastic(client: TestClient) -> None:
    request = {
        "min_gpus": 32,
        "max_gpus": 1500,
        "micro_batch_sizes": [8, 12, 16, 17],
        "max_global_batch_size": 10000,
    }
    response = client.post("/v1/plans/elastic", json=request)
    assert response.status_code == 200
    body = response.json()
    assert body["global_batch_size"] == 9792 and len(body["valid_gpus"]) == 23
    for c in body["counts"]:
        assert c["micro_batch_size"] * c["gradient_accumulation_steps"] * c["gpus"] == 9792
    assert body["deepspeed"]["elasticity"]["max_train_batch_size"] == 10000


def test_elastic_bad_input_names_the_field(client: TestClient) -> None:
    response = client.post(
        "/v1/plans/elastic",
        json={"min_gpus": 0, "max_gpus": 8, "micro_batch_sizes": [4], "max_global_batch_size": 64},
    )
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/min_gpus"
    response = client.post(
        "/v1/plans/elastic",
        json={"min_gpus": 9, "max_gpus": 8, "micro_batch_sizes": [4], "max_global_batch_size": 64},
    )
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/max_gpus"


def test_openapi_documents_the_new_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    export = paths["/v1/plans/export/{format}"]["post"]["responses"]
    assert {"200", "404", "422"} <= set(export)
    assert "torchrun" in export["200"]["content"]["text/plain"]["examples"]
    assert "/v1/plans/schedule" in paths and "/v1/plans/elastic" in paths
    assert "/v1/plans" in paths  # the planner's route still answers
