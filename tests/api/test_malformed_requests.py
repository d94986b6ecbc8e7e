"""Malformed requests to POST /v1/plans (bad JSON, wrong content types, deep nesting, bodies over
the limit) and unknown routes: each a 4xx RFC 9457 problem, never a 500."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.problems import assert_problem, base, post_raw


def test_bad_json_is_400(client: TestClient) -> None:
    assert_problem(post_raw(client, b'{"topology": '), 400)


def test_bad_json_names_the_line_and_column_and_no_pointer(client: TestClient) -> None:
    raw = '{\n  "topology": {"num_nodes": 2, "gpus_per_node": 8}\n  "global_batch_size": 512\n}'
    body = assert_problem(post_raw(client, raw), 400)
    assert body["type"] == "urn:batchplan:problem:malformed-body"
    assert body["detail"] == "the body is not valid JSON: Expecting ',' delimiter at line 3, column 3"
    assert "errors" not in body  # a character offset is no JSON Pointer


def test_wrong_content_type_is_400(client: TestClient) -> None:
    response = post_raw(client, json.dumps(base()), "text/plain")
    body = assert_problem(response, 400)
    assert "application/json" in body["detail"]
    assert body["type"] == "urn:batchplan:problem:unsupported-media-type"
    assert body["title"] == "The request body is not JSON"
    # One serialisation for every problem: as compact as the planner's own 422s.
    assert response.content == json.dumps(body, separators=(",", ":")).encode()
    schema_error = client.post("/v1/plans", json=base(global_batch_size=0))
    assert schema_error.content == json.dumps(schema_error.json(), separators=(",", ":")).encode()


def test_form_content_type_is_400(client: TestClient) -> None:
    assert_problem(post_raw(client, "a=1", "application/x-www-form-urlencoded"), 400)


def test_missing_content_type_with_a_body_is_400(client: TestClient) -> None:
    assert_problem(post_raw(client, json.dumps(base()), None), 400)


def test_json_suffix_media_types_are_accepted(client: TestClient) -> None:
    assert post_raw(client, json.dumps(base()), "application/merge-patch+json").status_code == 200
    assert post_raw(client, json.dumps(base()), "application/json; charset=utf-8").status_code == 200


@pytest.mark.parametrize("depth", [50, 5_000, 200_000])
def test_deeply_nested_json_is_a_4xx_not_a_500(client: TestClient, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    response = post_raw(client, '{"topology": ' + nested + ', "global_batch_size": 4}')
    assert 400 <= response.status_code < 500
    assert_problem(response, response.status_code)


# Every route that takes a JSON body reads it the same way (app.api.json_body).
BODY_ROUTES = ["/v1/plans", "/v1/plans/export/torchrun", "/v1/plans/schedule", "/v1/checks"]


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_bytes_that_are_not_utf8_are_a_malformed_body_at_their_line_and_column(
    client: TestClient, path: str
) -> None:
    raw = b'{"topology": {"node_groups": [\n  {"name": "h100-\xc3\xa9\xff", "num_nodes": 1}]}}'
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    body = assert_problem(response, 400)
    assert body["type"] == "urn:batchplan:problem:malformed-body"
    # Where a decoder that replaces what it cannot read puts its U+FFFD: the column counts
    # characters (the two bytes of the e-acute before it are one).
    text = raw.decode("utf-8", "replace")
    at = text.index("\ufffd")
    line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
    assert (line, column) == (2, 19)
    assert body["detail"] == (
        "the body is not valid JSON: byte 0xff is not UTF-8 (invalid start byte) "
        f"at line {line}, column {column}"
    )
    assert "errors" not in body


@pytest.mark.parametrize("path", BODY_ROUTES)
@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_nesting_deeper_than_the_parser_says_how_deep_and_where(
    client: TestClient, path: str, opening: str
) -> None:
    closing = "]" if opening == "[" else "}"
    raw = '{\n"topology": ' + opening * 5_000 + "1" + closing * 5_000 + "}"
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    body = assert_problem(response, 400)
    assert body["type"] == "urn:batchplan:problem:malformed-body"
    limit = sys.getrecursionlimit()
    # The bracket that opens level `limit` (the body's own object is level 1) on line 2.
    column = len('"topology": ' + opening * (limit - 2)) + 1
    assert body["detail"] == (
        f"the body is not valid JSON: arrays and objects nested at least {limit} deep, "
        f"more than the parser takes at line 2, column {column}"
    )


def test_nesting_a_little_too_deep_names_its_exact_depth(client: TestClient) -> None:
    depth = sys.getrecursionlimit() - 5  # past what the parser takes from inside the app
    raw = '{"topology": ' + "[" * depth + "]" * depth + "}"
    body = assert_problem(post_raw(client, raw), 400)
    assert f"nested {depth + 1} deep," in body["detail"]  # the body's own object, and the arrays


@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_too_long_to_convert_are_refused_at_their_field_as_1e400_is(
    client: TestClient, sign: str
) -> None:
    """Python converts at most 4,300 digits (sys.get_int_max_str_digits); beyond that the number
    is past every bound, and the field says so as it does for a float that overflows."""
    giant = sign + "9" * 5_000
    huge = sign + "1e400"
    for field in ("global_batch_size", "micro_batch_size"):
        raw = json.dumps({**base(), field: "NUMBER"})
        refused = post_raw(client, raw.replace('"NUMBER"', giant))
        assert refused.status_code == 422, refused.text
        over = post_raw(client, raw.replace('"NUMBER"', huge))
        assert refused.content == over.content
        assert refused.json()["errors"][0]["pointer"] == f"/{field}"


def test_nested_object_in_a_known_field_is_rejected(client: TestClient) -> None:
    nested = "{" + '"a": {' * 10_000 + "}" * 10_001
    response = post_raw(
        client, '{"topology": {"num_nodes": 1, "gpus_per_node": 1}, "dataset": ' + nested + "}"
    )
    assert 400 <= response.status_code < 500
    assert_problem(response, response.status_code)


def test_body_over_the_limit_is_413(client: TestClient, settings: Any) -> None:
    padding = " " * (settings.max_body_bytes + 1)
    body = assert_problem(post_raw(client, json.dumps(base()) + padding), 413)
    assert str(settings.max_body_bytes) in body["detail"]


def test_body_just_under_the_limit_is_served(client: TestClient, settings: Any) -> None:
    text = json.dumps(base())
    padding = " " * (settings.max_body_bytes - len(text))
    assert post_raw(client, text + padding).status_code == 200


def test_streamed_body_over_the_limit_is_413(client: TestClient, settings: Any) -> None:
    def chunks() -> Any:
        yield json.dumps(base()).encode()
        for _ in range(settings.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    response = client.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
    assert_problem(response, 413)


# -------------------------------------------------------------------- unknown routes


def test_unknown_route_is_a_404_problem(client: TestClient) -> None:
    assert_problem(client.get("/v1/nothing-here"), 404)


def test_wrong_method_is_a_405_problem(client: TestClient) -> None:
    assert_problem(client.get("/v1/plans"), 405)
    assert_problem(client.put("/v1/plans", json=base()), 405)
