"""The README and every page under docs/ say what the service does: each `curl` example is sent
to the app in-process as written, and its documented answer (abridged, `...` for what it
leaves out) must be what the app answers, number for number (tests/support/doc_examples.py
reads them out of the Markdown). Checks run on real warm ranks. The table of which exports
take tensor-, pipeline- and context-parallel plans is held to what each export does."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.doc_examples import ROOT, Example, examples, mismatches, pages, stated

from app.core.errors.domain import DomainError
from app.core.exports.parts.export_types import ExportInput
from app.core.exports.registry import EXPORTERS
from app.core.planner import plan
from app.main import create_app
from app.schemas.plan_requests import PlanRequestIn
from app.settings import Settings

EXAMPLES = [example for page in pages() for example in examples(page)]
PLANNER = [e for e in EXAMPLES if e.method == "POST" and not e.check]
WORKER = [e for e in EXAMPLES if e.check or e.method == "GET"]


def _id(example: Example) -> str:
    return example.source


def test_the_readme_links_every_docs_page_and_each_link_is_there() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", readme))
    assert linked == {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(((?:\.\./)?[\w./-]+\.md)\)", page.read_text()):
            assert (page.parent / target).resolve().exists(), (page.name, target)


def test_every_curl_on_every_page_is_read_as_an_example() -> None:
    for page in pages():
        commands = len(re.findall(r"^\s*curl -s", page.read_text(), re.MULTILINE))
        read = [e for e in examples(page)]
        fetches = len(re.findall(r"^\s*curl -s \S+/<id>", page.read_text(), re.MULTILINE))
        assert len(read) == commands - fetches, page.name
    assert {e.source.split(":")[0] for e in EXAMPLES} >= {
        "README.md",
        "docs/checks.md",
        "docs/contract.md",
        "docs/exports.md",
        "docs/meshes.md",
        "docs/recipe.md",
        "docs/tokens.md",
        "docs/your-own-model.md",
    }


# ----------------------------------------------------------------------------- the README's shape

README_WORDS = 2000  # what a newcomer reads through (issue 40): the rest lives in docs/ and bench/
FIRST_SCREEN = 50  # lines


def test_the_readme_is_short_and_starts_with_the_commands_that_run_and_test_it() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) < README_WORDS
    lines = readme.splitlines()
    run = next(i for i, line in enumerate(lines) if line.startswith("Run it ("))
    test = next(i for i, line in enumerate(lines) if line.startswith("Test it ("))
    cpu = next(i for i, line in enumerate(lines) if "download.pytorch.org/whl/cpu" in line)
    # Each command's block closes within the first screen, the CPU-wheel advice before both.
    assert cpu < run < test and lines.index("```", test + 2) < FIRST_SCREEN


def test_every_relative_link_of_the_readme_and_the_docs_is_there() -> None:
    for page in pages():
        for target in re.findall(r"\]\((?!https?:|#)([^)\s]+)\)", page.read_text()):
            assert (page.parent / target.split("#")[0]).resolve().exists(), (page.name, target)


def test_the_pages_say_no_dev_log_and_point_at_nothing_outside_the_repository() -> None:
    for page in pages():
        text = page.read_text()
        assert "../shared" not in text, page.name
        assert "this evening" not in text and "issue 26's starting commit" not in text, page.name


# A page that runs an export with `python -c 'from training_args import ...'` says what that
# export imports beyond the run-it install (torch and the package's own dependencies).
RUN_IT = {"torch", "fastapi", "pydantic", "pydantic_settings", "uvicorn", "typer", "httpx", "matplotlib"}


def _exports_run_with_python(page: Path) -> Iterator[tuple[str, Example, str]]:
    text = page.read_text()
    for match in re.finditer(r"python -c '(?:import|from) (\w+)", text):
        module = match.group(1)
        saved = [e for e in examples(page) if re.search(rf"-o {module}\.py\b", e.command)]
        if saved:
            following = text[match.end() :]
            section = following[: following.find("\n## ")] if "\n## " in following else following
            yield module, saved[-1], section


def test_an_export_run_with_python_says_the_install_it_needs(planner: TestClient) -> None:
    found = 0
    for page in pages():
        for module, example, section in _exports_run_with_python(page):
            found += 1
            source = planner.post(example.path, json=example.body).text
            imported = {
                name.split(".")[0]
                for name in re.findall(r"^\s*(?:import|from) ([\w.]+)", source, re.MULTILINE)
            }
            needed = imported - set(sys.stdlib_module_names) - RUN_IT
            assert needed, (page.name, module, "imports nothing beyond the run-it install")
            for package in needed:
                assert f"`{package}`" in section and f"pip install {package}" in section, (
                    page.name,
                    module,
                    package,
                )
    assert found >= 1


def _status(example: Example, default: int) -> int:
    stated_status = [v for k, v in stated(example.answer)[0] if k == "status" and isinstance(v, int)]
    return stated_status[0] if stated_status else default


def _json(text: str) -> Any:
    return json.loads(text)


@pytest.fixture(scope="module")
def planner() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(worker_enabled=False, log_level="warning"))) as client:
        yield client


@pytest.mark.parametrize("example", PLANNER, ids=_id)
def test_each_example_answers_as_documented(planner: TestClient, example: Example) -> None:
    response = planner.post(example.path, json=example.body)
    assert response.status_code == _status(example, 200), (example.source, response.text)
    if not example.answer and not response.headers["content-type"].startswith("application/"):
        return  # a chart or a script saved with -o: its status is all the page states
    real = _json(response.text)  # exports that are JSON (deepspeed) are read as JSON too
    assert not mismatches(example.answer, real), (example.source, mismatches(example.answer, real))


def test_a_documented_number_that_is_not_what_the_app_answers_is_caught(planner: TestClient) -> None:
    """The runner itself: an answer a digit off, or a list out of order, does not pass."""
    [first] = [e for e in PLANNER if e.source.startswith("README.md") and '"total_size"' in e.answer]
    real = planner.post(first.path, json=first.body).json()
    assert not mismatches(first.answer, real)
    assert mismatches(first.answer.replace("2503", "2504"), real)
    assert mismatches(first.answer.replace('"lr": 0.2', '"lr": 0.21'), real)
    assert mismatches(first.answer.replace("pads 1281167", "pads 1281166"), real)
    [elastic] = [e for e in PLANNER if e.path == "/v1/plans/elastic" and "resume" not in e.body]
    real = planner.post(elastic.path, json=elastic.body).json()
    assert mismatches(elastic.answer.replace("[32, 34, 36, 48", "[32, 36, 34, 48"), real)


@pytest.fixture
def worker(default_worker: TestClient) -> TestClient:
    return default_worker  # tests/conftest.py: a default server's ranks and models


@pytest.mark.slow
@pytest.mark.parametrize("example", WORKER, ids=_id)
def test_each_check_example_answers_as_documented(worker: TestClient, example: Example) -> None:
    pytest.importorskip("torch")
    from support.polling import run_check

    if example.method == "GET":
        assert worker.get(example.path).status_code == 200, example.source
        return
    job = run_check(worker, example.body, timeout=180)
    assert job["status"] == "succeeded", (example.source, job)
    assert job["result"]["passed"], (example.source, job["result"])
    assert not mismatches(example.answer, job), (example.source, mismatches(example.answer, job))
    for path in example.follow_ups:
        fetched = worker.get(path.replace("<id>", job["id"]))
        assert fetched.status_code == 200 and fetched.content, (example.source, path, fetched.text[:300])


# ----------------------------------------------------------------------------- the exports table


def _parallel_table() -> dict[str, dict[str, str]]:
    text = (ROOT / "docs" / "exports.md").read_text()
    section = text[text.index("## Tensor, pipeline and context parallel plans") :]
    rows = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        fmt, tensor, pipeline, context, _why = (c.strip() for c in row.strip("|").split("|"))
        table[fmt.strip("`")] = {"tensor": tensor, "pipeline": pipeline, "context": context}
    return table


@pytest.mark.parametrize("size", ["tensor", "pipeline", "context"])
def test_the_exports_table_says_which_formats_take_each_parallel_size(size: str) -> None:
    table = _parallel_table()
    assert set(table) == set(EXPORTERS)
    body = {
        "topology": {"num_nodes": 2, "gpus_per_node": 8},
        "global_batch_size": 512,
        "parallelism": {size: 2},
    }
    request = PlanRequestIn.model_validate(body).to_core()
    planned = plan(request)
    for fmt, exporter in EXPORTERS.items():
        try:
            exporter(ExportInput(request, planned))
            written = "yes"
        except DomainError:
            written = "refused"
        assert table[fmt][size] == written, (fmt, size)
