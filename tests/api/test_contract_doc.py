"""docs/contract.md, the contract job-submission tooling depends on, is held to the OpenAPI
document the service serves (issue 40): every field of its JSON examples exists at that path in
the schema of its endpoint (the request body, or the answer it shows), every other field it
names exists in the schemas of the endpoints its section is about, and every setting it names
is one the service reads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = (ROOT / "docs" / "contract.md").read_text()

# The endpoints each section of the contract is about; None: every operation.
SECTIONS: dict[str, list[tuple[str, str]] | None] = {
    "POST /v1/plans": [("post", "/v1/plans")],
    "Schedules": [("post", "/v1/plans/schedule")],
    "Gradient checks (the worker)": [
        ("post", "/v1/checks"),
        ("get", "/v1/checks"),
        ("get", "/v1/checks/{check_id}"),
        ("delete", "/v1/checks/{check_id}"),
    ],
    "Operations": [("get", "/livez"), ("get", "/readyz"), ("get", "/metrics"), ("get", "/v1/host")],
    "Fields added since v1 was first written (as served today; same stability)": None,
    "Examples and how the numbers are chosen": None,
}
# Words in backticks that name no field: values the contract quotes, which the schema holds as
# plain strings (mesh dimension names, a wrapper, a sampler kind), and the setting section's.
NOT_FIELDS = {"pp", "dp_replicate", "dp_shard", "cp", "tp", "ddp", "proportional", "mlp"}
# Control names the contract quotes: values of a result's `controls[].name`, held to the
# worker's own controls below.
CONTROLS = {
    "scheduler_per_micro_batch",
    "scheduler_per_process",
    "set_epoch_missing",
    "clip_before_all_reduce",
    "resume_without_skip",
    "resume_schedule_restart",
    "resume_keeps_micro_batch",
    "resume_per_rank_position",
}


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as client:
        document: dict[str, Any] = client.get("/openapi.json").json()
    return document


def _sections() -> Iterator[tuple[str, str]]:
    parts = re.split(r"^## (.+)$", CONTRACT, flags=re.MULTILINE)
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        yield title.strip(), body


class Schemas:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def branches(self, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """The schema, its $ref followed and its anyOf/oneOf/allOf branches, flattened."""
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            return self.branches(self.document["components"]["schemas"][name])
        out = [schema]
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in schema.get(key, []):
                out += self.branches(branch)
        return out

    def child(self, schema: dict[str, Any], name: str) -> list[dict[str, Any]]:
        found = []
        for branch in self.branches(schema):
            if name in branch.get("properties", {}):
                found.append(branch["properties"][name])
            if isinstance(branch.get("additionalProperties"), dict):
                found.append(branch["additionalProperties"])
        return found

    def items(self, schema: dict[str, Any]) -> list[dict[str, Any]]:
        return [b["items"] for b in self.branches(schema) if isinstance(b.get("items"), dict)]

    def has(self, schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
        """The paths in the JSON `value` that `schema` has no field for."""
        missing = []
        if isinstance(value, dict):
            for key, inner in value.items():
                children = self.child(schema, key)
                if not children:
                    missing.append(f"{path}/{key}")
                elif not any(not self.has(c, inner, f"{path}/{key}") for c in children):
                    missing += self.has(children[0], inner, f"{path}/{key}")
        elif isinstance(value, list):
            for i, inner in enumerate(value):
                items = self.items(schema)
                if isinstance(inner, (dict, list)) and items:
                    missing += self.has(items[0], inner, f"{path}/{i}")
        return missing

    def names(self, schema: dict[str, Any], seen: set[int] | None = None) -> set[str]:
        """Every field name and enum value reachable from `schema`."""
        seen = set() if seen is None else seen
        out: set[str] = set()
        for branch in self.branches(schema):
            if id(branch) in seen:
                continue
            seen.add(id(branch))
            out |= {str(v) for v in branch.get("enum", [])}
            for name, inner in branch.get("properties", {}).items():
                out.add(name)
                out |= self.names(inner, seen)
            for key in ("items", "additionalProperties"):
                if isinstance(branch.get(key), dict):
                    out |= self.names(branch[key], seen)
        return out

    def operation_names(self, method: str, path: str) -> set[str]:
        op = self.document["paths"][path][method]
        out: set[str] = set()
        for parameter in op.get("parameters", []):
            out.add(parameter["name"])
            out |= self.names(parameter.get("schema", {}))
        for content in op.get("requestBody", {}).get("content", {}).values():
            out |= self.names(content.get("schema", {}))
        for response in op.get("responses", {}).values():
            for content in response.get("content", {}).values():
                out |= self.names(content.get("schema", {}))
        return out


def _json_blocks(body: str) -> Iterator[tuple[str, Any]]:
    """(the line that introduces it, the JSON) of each json block; a fragment `"key": {...}`
    is read as an object."""
    for intro, block in re.findall(r"([^\n]*)\n\n```json\n(.*?)\n```", body, re.DOTALL):
        text = block.strip()
        yield intro, json.loads(text if text.startswith("{") else "{" + text + "}")


def _schema(document: dict[str, Any], method: str, path: str, response: str | None) -> dict[str, Any]:
    op = document["paths"][path][method]
    holder = op["responses"][response] if response else op["requestBody"]
    schema: dict[str, Any] = holder["content"]["application/json"]["schema"]
    return schema


def test_every_field_of_the_contracts_examples_is_in_the_schema(openapi: dict[str, Any]) -> None:
    schemas = Schemas(openapi)
    [plans] = [body for title, body in _sections() if title == "POST /v1/plans"]
    blocks = list(_json_blocks(plans))
    assert len(blocks) == 3
    for intro, value in blocks:
        response = "200" if intro.startswith("Response 200") else None
        schema = _schema(openapi, "post", "/v1/plans", response)
        assert schemas.has(schema, value) == [], (intro, schemas.has(schema, value))


def _named(body: str) -> set[str]:
    """The words in backticks that look like field names or values: `name`, `a.b`, `a[].b`."""
    found = set()
    prose = re.sub(r"```.*?```", "", body, flags=re.DOTALL)  # code blocks' fences are not inline code
    for token in re.findall(r"`([^`]+)`", prose):
        if token.startswith(("/", "info.")) or " " in token.replace(", ", ","):
            continue  # a path, a command, a phrase, the OpenAPI document's own info (checked below)
        if re.search(r"\.(py|md|json|yml|yaml)$", token):
            continue  # a file
        for part in re.split(r"[,/]\s*", token):
            if re.fullmatch(r"[a-z][a-z0-9_]+(\.[a-z][a-z0-9_]*|\[\])*", part):  # not a variable: `g`
                found.add(part.replace("[]", "").rsplit(".", 1)[-1])
    return found


def test_every_field_the_contract_names_is_in_the_schema_of_its_endpoints(openapi: dict[str, Any]) -> None:
    schemas = Schemas(openapi)
    every = [(m, p) for p, ops in openapi["paths"].items() for m in ops]
    checked = 0
    for title, body in _sections():
        if title not in SECTIONS:
            continue
        operations = SECTIONS[title] or every
        known = set().union(*(schemas.operation_names(m, p) for m, p in operations))
        names = _named(body) - NOT_FIELDS - CONTROLS
        assert names - known == set(), (title, sorted(names - known))
        checked += len(names)
    assert checked > 100


def test_the_control_names_and_document_info_the_contract_quotes_are_served(openapi: dict[str, Any]) -> None:
    assert CONTROLS <= _named(CONTRACT)
    assert "`info.version`" in CONTRACT and openapi["info"]["version"]
    pytest.importorskip("torch")
    from app.worker.checks.controls import Control
    from app.worker.checks.resume import controls as resume_controls
    from app.worker.checks.run import controls as run_controls

    modules = (run_controls, resume_controls)
    served = {v.name for m in modules for v in vars(m).values() if isinstance(v, Control)}
    assert served >= CONTROLS


def test_every_setting_the_contract_names_is_read_by_the_service() -> None:
    named = set(re.findall(r"BATCHPLAN_[A-Z_]+", CONTRACT))
    read = {f"BATCHPLAN_{name.upper()}" for name in Settings.model_fields}
    assert named and named <= read, sorted(named - read)


def test_every_section_of_the_contract_is_checked() -> None:
    titles = [title for title, _ in _sections()]
    assert set(titles) - set(SECTIONS) == {"Settings that deployments rely on"}
