"""The golden answers of POST /v1/plans: a varied set of requests and, for each, the status, every
response header in order and the body bytes the service gave when they were recorded.

tests/api/test_plans_golden.py replays them and wants every byte back. When an answer changes
on purpose (a new field, a better message), regenerate the file and read its diff:

    .venv/bin/python -m tests.support.golden_plans          # rewrites tests/api/plans_golden.jsonl

The requests are generated here, deterministically (seeded), and stored with the answers, so
the test replays exactly what was recorded.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.main import create_app
from app.settings import Settings

from .asgi import Answer, Sent, call, json_request
from .plan_bodies import broken_body, dumps, example_bodies, large_bodies, random_body

GOLDEN = Path(__file__).resolve().parents[1] / "api" / "plans_golden.jsonl"
API_KEY = "golden-key"
SMALL_LIMIT = 2048

# The apps the requests go to: the defaults, the API key on the planner, a small body limit.
APPS: dict[str, dict[str, Any]] = {
    "default": {},
    "protected": {"api_key": API_KEY, "protect_planner": True},
    "small_limit": {"max_body_bytes": SMALL_LIMIT},
}


def build_app(variant: str, **extra: Any) -> Any:
    return create_app(Settings(worker_enabled=False, **APPS[variant], **extra))


def _plain(name: str, body: bytes, **kw: Any) -> tuple[str, str, Sent]:
    return name, "default", json_request(body, request_id=f"golden-{name}", **kw)


_TWO_BY_EIGHT = b'{"topology":{"num_nodes":2,"gpus_per_node":8},'
_ONE_BY_TWO = b'{"topology":{"num_nodes":1,"gpus_per_node":2},'


def _group(name: bytes) -> bytes:
    return b'{"topology":{"node_groups":[{"name":"' + name + b'","num_nodes":1,"gpus_per_node":1}]},'


# Bodies that are wrong (or odd) as JSON rather than as a plan.
RAW_BODIES: list[tuple[str, bytes]] = [
    ("raw-duplicate-keys", _TWO_BY_EIGHT + b'"global_batch_size":7,"global_batch_size":512}'),
    ("raw-whole-floats", b'{"topology":{"num_nodes":2.0,"gpus_per_node":8},"global_batch_size":512.0}'),
    ("raw-truncated", _TWO_BY_EIGHT + b'"global_b'),
    ("raw-trailing-comma", _TWO_BY_EIGHT + b'"global_batch_size":512,}'),
    ("raw-not-json", b"global batch 512 please"),
    ("raw-missing-comma", b'{"topology": {"num_nodes": 2, "gpus_per_node": 8}\n  "global_batch_size": 512}'),
    ("raw-null", b"null"),
    ("raw-array", b"[1, 2]"),
    ("raw-string", b'"plan"'),
    ("raw-number", b"512"),
    (
        "raw-nan-throughput",
        b'{"topology":{"node_groups":[{"num_nodes":1,"gpus_per_node":2,"relative_throughput":NaN}]},'
        b'"global_batch_size":4}',
    ),
    ("raw-infinity-lr", _ONE_BY_TWO + b'"global_batch_size":4,"learning_rate":{"base_lr":Infinity}}'),
    ("raw-huge-float", _ONE_BY_TWO + b'"global_batch_size":1e400}'),
    ("raw-huge-int", _ONE_BY_TWO + b'"global_batch_size":' + b"9" * 400 + b"}"),
    ("raw-giant-int", _ONE_BY_TWO + b'"global_batch_size":' + b"9" * 5000 + b"}"),
    ("raw-invalid-utf8", _group(b"\xff\xfe") + b'"global_batch_size":4}'),
    ("raw-lone-surrogate", _group(b"\\ud800") + b'"global_batch_size":4}'),
    ("raw-unicode-name", _group("h100-\u00e9".encode()) + b'"global_batch_size":4}'),
    ("raw-deep", b'{"topology":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("raw-nested-object", b'{"topology":{"num_nodes":{"n":2},"gpus_per_node":8},"global_batch_size":4}'),
]


def _with(sent: Sent, *headers: tuple[str, str], method: str | None = None, path: str | None = None) -> Sent:
    return Sent(method or sent.method, path or sent.path, (*sent.headers, *headers), sent.body, sent.chunks)


def _chunked(body: bytes, request_id: str, chunks: int) -> Sent:
    headers = [h for h in json_request(body, request_id=request_id).headers if h[0] != "content-length"]
    return Sent("POST", "/v1/plans", (*headers, ("transfer-encoding", "chunked")), body, chunks)


def _raw_cases() -> Iterator[tuple[str, str, Sent]]:
    """Requests that are wrong (or odd) as HTTP or JSON rather than as a plan."""
    valid = _TWO_BY_EIGHT + b'"global_batch_size":512}'
    yield _plain("raw-valid-charset", valid, content_type="application/json; charset=utf-8")
    yield _plain("raw-valid-uppercase-type", valid, content_type="Application/JSON")
    yield _plain("raw-valid-suffix-type", valid, content_type="application/merge-patch+json")
    yield _plain("raw-valid-spaces", json.dumps(json.loads(valid), indent=2).encode())
    yield _plain("raw-valid-bom", b"\xef\xbb\xbf" + valid)
    yield _plain("raw-valid-utf16", json.dumps(json.loads(valid)).encode("utf-16"))
    yield _plain("raw-text-plain", valid, content_type="text/plain")
    yield _plain("raw-form", b"global_batch_size=512", content_type="application/x-www-form-urlencoded")
    yield _plain("raw-no-content-type", valid, content_type=None)
    yield _plain("raw-empty", b"")
    yield _plain("raw-empty-no-type", b"", content_type=None)
    for name, body in RAW_BODIES:
        yield _plain(name, body)
    yield "raw-chunked-valid", "default", _chunked(valid, "golden-chunked", 3)
    big = valid[:-1] + b',"x":"' + b"y" * 4000 + b'"}'
    yield "limit-chunked-over", "small_limit", _chunked(big, "golden-chunked-over", 4)
    yield "limit-over", "small_limit", json_request(big, request_id="golden-limit-over")
    yield "limit-valid", "small_limit", json_request(valid, request_id="golden-limit-valid")
    yield (
        "method-get",
        "default",
        Sent("GET", "/v1/plans", (("host", "testserver"), ("x-request-id", "golden-get"))),
    )
    yield "method-put", "default", _with(json_request(valid, request_id="golden-put"), method="PUT")
    yield (
        "path-trailing-slash",
        "default",
        _with(json_request(valid, request_id="golden-slash"), path="/v1/plans/"),
    )
    yield "request-id-invalid", "default", json_request(valid, request_id="not valid!")
    for name, auth in (
        ("key-missing", ()),
        ("key-wrong", (("authorization", "Bearer nope"),)),
        ("key-bearer", (("authorization", f"Bearer {API_KEY}"),)),
        ("key-header", (("x-api-key", API_KEY),)),
    ):
        yield name, "protected", _with(json_request(valid, request_id=f"golden-{name}"), *auth)


def cases() -> Iterator[tuple[str, str, Sent]]:
    """(name, app variant, request) for every golden answer."""
    for name, body in example_bodies():
        yield _plain(name, dumps(body))
    for name, body in large_bodies():
        yield _plain(name, dumps(body))
    rng = random.Random(26)
    for i in range(160):
        yield _plain(f"random-{i}", dumps(random_body(rng)))
    for i in range(60):
        yield _plain(f"broken-{i}", dumps(broken_body(rng)))
    yield from _raw_cases()


def _text(data: bytes) -> dict[str, str]:
    """Bytes as JSON can hold them: text when they are UTF-8, else base64."""
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _bytes(held: dict[str, str]) -> bytes:
    return held["text"].encode() if "text" in held else base64.b64decode(held["base64"])


def _generated_id(answer: Answer) -> tuple[tuple[str, str], ...]:
    """The headers, with a request id the server made up replaced by a marker."""
    return tuple((k, "<generated>" if k == "x-request-id" and len(v) == 32 else v) for k, v in answer.headers)


def record(sent: Sent, answer: Answer) -> dict[str, Any]:
    return {
        "request": {
            "method": sent.method,
            "path": sent.path,
            "headers": [list(h) for h in sent.headers],
            "body": _text(sent.body),
            "chunks": sent.chunks,
        },
        "status": answer.status,
        "headers": [list(h) for h in _generated_id(answer)],
        "body": _text(answer.body),
    }


def load() -> list[dict[str, Any]]:
    return [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]


def request_of(entry: dict[str, Any]) -> Sent:
    """The request of a recorded entry."""
    r = entry["request"]
    return Sent(r["method"], r["path"], tuple(tuple(h) for h in r["headers"]), _bytes(r["body"]), r["chunks"])


def replay(entry: dict[str, Any], app: Any) -> dict[str, Any]:
    """Send a recorded request again; the answer in the recorded shape."""
    sent = request_of(entry)
    return record(sent, call(app, sent))


def main() -> None:
    apps = {variant: build_app(variant) for variant in APPS}
    lines = []
    for name, variant, sent in cases():
        entry = {"name": name, "app": variant, **record(sent, call(apps[variant], sent))}
        lines.append(json.dumps(entry, ensure_ascii=False, sort_keys=False))
    GOLDEN.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} answers to {GOLDEN}")


if __name__ == "__main__":
    main()
