"""Swagger leads with `POST /v1/plans`, the question the service answers (issue 40, item 6), not
with the exports."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings


def test_swagger_leads_with_planning() -> None:
    """Swagger UI groups operations by tag, in the order of the document's `tags`, and lists
    each tag's operations in the order of `paths`: POST /v1/plans comes first."""
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as client:
        document = client.get("/openapi.json").json()
    operations = [op for ops in document["paths"].values() for op in ops.values()]
    tags = [tag["name"] for tag in document["tags"]]
    assert tags[0] == "plans"
    assert set(tags) == {t for op in operations for t in op["tags"]}
    assert all(tag.get("description") for tag in document["tags"])
    first_path = next(iter(document["paths"]))
    assert (first_path, next(iter(document["paths"][first_path]))) == ("/v1/plans", "post")
