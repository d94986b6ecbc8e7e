"""A stream plan's check request, built into the spec every rank runs (no worker): the stream
and each rank's micro-batch reach the spec, and what the stream check cannot run is a 422 at
its field, saying what works (too many DataLoader workers, a run, a missing library)."""

from __future__ import annotations

from typing import Any

import pytest

from app.contract.kinds import stream as stream_kind
from app.contract.request import build_spec, check_request
from app.contract.spec_error import SpecError


def body(**dataset: Any) -> dict[str, Any]:
    plan = {
        "topology": {"num_nodes": 1, "gpus_per_node": 4},
        "global_batch_size": 32,
        "micro_batch_size": 8,
        "dataset": {
            "kind": "stream",
            "num_samples": 256,
            "num_shards": 16,
            "splitter": "webdataset",
            **dataset,
        },
    }
    return {"plan": plan}


def refused(sent: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        build_spec(check_request(sent))
    return caught.value


def test_the_spec_carries_the_stream_and_each_ranks_micro_batch() -> None:
    spec = build_spec(check_request(body(num_workers=2)))
    assert spec.stream is not None
    assert spec.stream.dataset.splitter == "webdataset" and spec.stream.dataset.num_workers == 2
    assert spec.stream.micro_batch_sizes == (8, 8, 8, 8) and spec.stream.accumulation == 1


def test_what_a_stream_check_cannot_run_is_refused_at_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    err = refused(body(num_workers=8))
    assert err.pointer == "/plan/dataset/num_workers" and "num_workers 4" in str(err)
    err = refused({**body(), "steps": 3})
    assert err.pointer == "/steps"
    short = body(num_samples=24, num_shards=4, end_of_epoch="steps")  # 1 micro-batch a rank, of a step's 2
    short["plan"]["global_batch_size"] = 64
    err = refused(short)
    assert err.pointer == "/plan/dataset/num_samples" and "no optimizer step" in str(err)
    monkeypatch.setitem(stream_kind.LIBRARIES, "webdataset", "no_such_stream_library")
    err = refused(body())
    assert err.pointer == "/plan/dataset/splitter" and "'no_such_stream_library' is not installed" in str(err)
