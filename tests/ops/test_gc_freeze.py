"""The server moves what startup built out of the garbage collector's way while it serves
(BATCHPLAN_GC_FREEZE), and hands it back when it stops, so that many apps in one process (as
here) do not pile up uncollectable objects. What it buys is measured by bench/bench_scaling.py."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

BODY = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}


def test_startup_objects_are_frozen_while_serving_and_released_after() -> None:
    gc.unfreeze()
    app = create_app(Settings(worker_enabled=False))
    with TestClient(app) as client:
        frozen = gc.get_freeze_count()
        # The app itself is among them: a full collection no longer walks it.
        assert frozen > 10_000
        assert client.post("/v1/plans", json=BODY).status_code == 200
        assert gc.get_freeze_count() <= frozen  # a request's objects are not frozen
    assert gc.get_freeze_count() == 0


def test_the_freeze_can_be_turned_off() -> None:
    gc.unfreeze()
    with TestClient(create_app(Settings(worker_enabled=False, gc_freeze=False))) as client:
        assert gc.get_freeze_count() == 0
        assert client.post("/v1/plans", json=BODY).status_code == 200
