"""A body over the limit gets its 413 in Python's urllib too: urllib sends the whole body before it
reads the answer, so a server that answered and closed unread would reset the connection under
it. A real uvicorn on a loopback socket (in this process, planner only)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import uvicorn

from app.main import create_app
from app.ports import free_port
from app.settings import Settings


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(create_app(Settings(worker_enabled=False)), port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_a_5_mb_body_gets_its_413_in_urllib(url: str) -> None:
    body = b" " * (5 * 1024 * 1024)
    request = urllib.request.Request(
        f"{url}/v1/plans", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=30)
    assert raised.value.code == 413
    problem = json.loads(raised.value.read())
    assert problem["status"] == 413 and "limit" in problem["detail"], problem
