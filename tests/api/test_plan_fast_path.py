"""The pure-ASGI fast path of POST /v1/plans answers exactly as the FastAPI route does.

Two apps side by side, one with the fast path (the default) and one without
(BATCHPLAN_PLAN_FAST_PATH=false): every request, valid or not, gets the same status, the same
headers in the same order and the same body bytes from both, and the middleware around them
(request ids, metrics, the access log, CORS) sees the same requests. When the request or answer
schema changes, these tests hold the two paths together; the golden answers
(test_plans_golden.py) hold both to what was recorded.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.plan_fast_path import PlanFastPath
from app.api.plans import plan_route
from app.logging_setup import request_id_var
from app.main import create_app
from app.settings import Settings
from tests.support.asgi import Answer, Sent, call, json_request
from tests.support.golden_plans import APPS, load, record, request_of
from tests.support.plan_bodies import broken_body, dumps, random_body

VALID = {"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512}


def pair(**settings_: Any) -> tuple[Any, Any]:
    """(with the fast path, without it), otherwise alike."""
    fast = create_app(Settings(worker_enabled=False, **settings_))
    route = create_app(Settings(worker_enabled=False, plan_fast_path=False, **settings_))
    return fast, route


@pytest.fixture(scope="module")
def apps() -> tuple[Any, Any]:
    return pair()


def same(apps: tuple[Any, Any], sent: Sent) -> Answer:
    """The answer of both apps, which must agree (a request id the server made up aside)."""
    fast, route = (call(app, sent) for app in apps)
    assert record(sent, fast) == record(sent, route)
    return fast


def test_the_fast_path_is_on_by_default_and_answers_valid_bodies_itself() -> None:
    """A valid body never reaches the route; an invalid one reaches it with its body intact."""
    reached: list[bytes] = []

    async def route(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        reached.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"route"})

    fast = PlanFastPath(route, route=plan_route(), exception_handlers={})
    answer = call(fast, json_request(dumps(VALID), request_id="r1"))
    assert answer.status == 200 and json.loads(answer.body)["global_batch_size"] == 512
    assert answer.scope["route"] is plan_route() and reached == []

    for body in (dumps({**VALID, "global_batch_size": -1}), b"{not json", dumps({**VALID, "x": 1})):
        answer = call(fast, json_request(body, request_id="r2"))
        assert (answer.status, answer.body, reached[-1]) == (299, b"route", body)
    assert PlanFastPath in [m.cls for m in create_app(Settings(worker_enabled=False)).user_middleware]


def test_in_the_app_valid_and_infeasible_bodies_are_answered_without_routing() -> None:
    """Routing leaves its mark in the scope (the endpoint it picked); the fast path does not,
    and a schema error still goes to the route, which computes its checked suggestions."""
    bodies = {
        "valid": (VALID, 200, False),
        "infeasible": ({**VALID, "global_batch_size": 1000, "micro_batch_size": 32}, 422, False),
        "schema error": ({**VALID, "global_batch_size": -1}, 422, True),
    }
    for fast in (True, False):
        app = create_app(Settings(worker_enabled=False, plan_fast_path=fast))
        for name, (body, status, routed) in bodies.items():
            answer = call(app, json_request(dumps(body), request_id=name))
            assert answer.status == status, name
            assert ("endpoint" in answer.scope) is (routed or not fast), (name, fast)
            assert answer.scope["route"] is plan_route()


@pytest.fixture(scope="module")
def variants() -> dict[str, tuple[Any, Any]]:
    return {variant: pair(**APPS[variant]) for variant in APPS}


@pytest.mark.parametrize("entry", load(), ids=lambda entry: entry["name"])
def test_every_golden_request_gets_the_same_bytes_from_both(
    entry: dict[str, Any], variants: dict[str, tuple[Any, Any]]
) -> None:
    same(variants[entry["app"]], request_of(entry))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), broken=st.booleans())
def test_random_plans_get_the_same_bytes_from_both(apps: tuple[Any, Any], seed: int, broken: bool) -> None:
    rng = random.Random(seed)
    body = broken_body(rng) if broken else random_body(rng)
    same(apps, json_request(dumps(body), request_id=f"h{seed}"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), where=st.integers(0, 10**6), value=JSON)
def test_any_json_anywhere_gets_the_same_bytes_from_both(
    apps: tuple[Any, Any], seed: int, where: int, value: Any
) -> None:
    """A random plan with any JSON value put at any place in it (NaN and infinities included)."""
    body = random_body(random.Random(seed))
    paths = list(_paths(body))
    path = paths[where % len(paths)]
    if not path:
        body = value
    else:
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    same(apps, json_request(json.dumps(body).encode(), request_id="any"))


_TEXT = json.dumps(VALID)
_NAMED = (
    '{"topology": {"node_groups": [{"name": "%s", "num_nodes": 2, "gpus_per_node": 8}]}, '
    '"global_batch_size": 64}'
)

# Bodies whose bytes, not their JSON values, are the point: the fast path parses them with
# pydantic's validate_json, the route with json.loads; where the two parsers could part
# (encodings, duplicate keys, numbers json.loads refuses), the answers must not.
RAW_BODIES = {
    "utf-16": _TEXT.encode("utf-16"),
    "utf-8 byte-order mark": b"\xef\xbb\xbf" + _TEXT.encode(),
    "invalid utf-8 in a name": (_NAMED % "a\udcff").encode("utf-8", "surrogateescape"),
    "lone surrogate escape in a name": (_NAMED % "a\\ud800").encode(),
    "escaped name": (_NAMED % "h\\u0031\\u0030\\u0030").encode(),
    "utf-8 name": (_NAMED % "é").encode(),
    "duplicate key, last wins": _TEXT[:-1].encode() + b', "global_batch_size": 256}',
    "duplicate nested key": _TEXT.replace('"num_nodes": 2', '"num_nodes": 3, "num_nodes": 2').encode(),
    "whitespace around": b" \n\t" + _TEXT.encode() + b"\r\n ",
    "trailing garbage": _TEXT.encode() + b"x",
    "two documents": _TEXT.encode() * 2,
    "a 5,000-digit count": _TEXT.replace("512", "9" * 5000).encode(),
    "an exponent count": _TEXT.replace("512", "5.12e2").encode(),
    "an overflowing float": _TEXT.replace("512", "1e400").encode(),
    "NaN": _TEXT.replace("512", "NaN").encode(),
    "-0.0 noise scale": _TEXT[:-1].encode() + b', "gradient_noise_scale": -0.0}',
    "a long float": _TEXT[:-1].encode() + b', "gradient_noise_scale": 4096.00000000000000000000001}',
    "deep nesting": b"[" * 5000 + b"]" * 5000,
    "empty": b"",
}


@pytest.mark.parametrize("body", RAW_BODIES.values(), ids=RAW_BODIES.keys())
def test_bodies_the_two_parsers_could_read_apart_get_the_same_bytes_from_both(
    apps: tuple[Any, Any], body: bytes
) -> None:
    same(apps, json_request(body, request_id="raw"))


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[Any, ...]] = []

    def emit(self, record: logging.LogRecord) -> None:
        extra = record.__dict__
        self.lines.append(
            (extra["method"], extra["route"], extra["path"], extra["status"], request_id_var.get())
        )


MIDDLEWARE_REQUESTS = [
    json_request(dumps(VALID), request_id="m-valid"),
    json_request(
        dumps({**VALID, "global_batch_size": 1000, "micro_batch_size": 32}), request_id="m-infeasible"
    ),
    json_request(dumps({**VALID, "global_batch_size": 0}), request_id="m-schema"),
    json_request(b"{", request_id="m-json"),
    json_request(dumps(VALID), request_id="m-text", content_type="text/plain"),
    json_request(dumps(VALID), request_id="not a valid id!"),
]


def test_middleware_sees_the_same_requests_either_way() -> None:
    """Request ids, metrics and access-log lines come out alike: the fast path's requests are
    labelled with the route's template, not `unmatched`."""
    seen: list[Any] = []
    for app in pair():
        capture = _Capture()
        access = logging.getLogger("batchplan.access")
        access.addHandler(capture)
        level = access.level
        access.setLevel(logging.INFO)
        try:
            answers = [call(app, sent) for sent in MIDDLEWARE_REQUESTS]
        finally:
            access.removeHandler(capture)
            access.setLevel(level)
        ids = [dict(a.headers)["x-request-id"] for a in answers]
        assert ids[:5] == ["m-valid", "m-infeasible", "m-schema", "m-json", "m-text"]
        assert len(ids[5]) == 32 and ids[5] != "not a valid id!"
        metrics = call(app, Sent("GET", "/metrics", (("host", "testserver"),))).body.decode()
        counted = sorted(
            line for line in metrics.splitlines() if line.startswith("batchplan_http_requests_total{")
        )
        plans = [line for line in capture.lines if line[2] == "/v1/plans"]
        logged = [line[:4] for line in plans]
        assert [line[4] for line in plans] == ids
        seen.append((counted, logged, [a.status for a in answers]))
    assert seen[0] == seen[1]
    counted, logged, statuses = seen[0]
    assert statuses == [200, 422, 422, 400, 400, 200]
    assert 'batchplan_http_requests_total{method="POST",route="/v1/plans",status="200"} 2.0' in counted
    # A wrong content type is refused before routing, by either app.
    assert [line[1] for line in logged] == ["/v1/plans"] * 4 + ["unmatched", "/v1/plans"]


def test_cors_headers_are_added_to_fast_path_answers() -> None:
    apps = pair(cors_origins=["https://ui.example"])
    sent = json_request(dumps(VALID), request_id="cors")
    answer = same(
        apps, Sent(sent.method, sent.path, (*sent.headers, ("origin", "https://ui.example")), sent.body)
    )
    assert dict(answer.headers)["access-control-allow-origin"] == "https://ui.example"


def test_with_the_api_key_on_the_planner_every_request_takes_the_route() -> None:
    app = create_app(Settings(worker_enabled=False, api_key="k", protect_planner=True))
    assert all(m.cls is not PlanFastPath for m in app.user_middleware)
    assert call(app, json_request(dumps(VALID), request_id="no-key")).status == 401
