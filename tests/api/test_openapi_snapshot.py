"""The OpenAPI document is the contract tooling generates clients from: a refactor must leave
it byte-for-byte as it was. A deliberate change regenerates the snapshot:

    python -c "from tests.api.test_openapi_snapshot import write; write()"
"""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app

SNAPSHOT = Path(__file__).with_name("openapi.snapshot.json")


def _served() -> bytes:
    with TestClient(create_app()) as client:
        response = client.get("/openapi.json")
        assert response.status_code == 200
        return response.content


def write() -> None:
    SNAPSHOT.write_bytes(_served())


def test_openapi_is_byte_for_byte_the_snapshot() -> None:
    served = _served()
    assert served == SNAPSHOT.read_bytes(), "the OpenAPI schema changed; see this module's docstring"
