"""The recipe, run as it reads: docs/exports.md's schedule example (a real warmup, the numbers
it prints) and docs/recipe.md's "One recipe, end to end" (plan -> chart -> hf-trainer export ->
the export's lr at every step is the plan's), which the README's first version held."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]
RECIPE_PAGE = (ROOT / "docs" / "recipe.md").read_text()
EXPORTS_PAGE = (ROOT / "docs" / "exports.md").read_text()


def _section(title: str) -> str:
    """From the heading to the next one (## or ###; a `# ` line in a code block is a comment)."""
    start = RECIPE_PAGE.index(title)
    end = re.compile(r"\n#{2,3} ").search(RECIPE_PAGE, start + len(title))
    return RECIPE_PAGE[start : end.start() if end else len(RECIPE_PAGE)]


def _commented(text: str, first: str) -> str:
    """The `# ...` lines from the one starting with `first`, joined: what the README prints."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith(f"# {first}"))
    out = []
    for line in lines[i:]:
        if not line.strip().startswith("#"):
            break
        out.append(line.strip().lstrip("#").strip())
    return " ".join(out)


def _schedule_example() -> dict[str, Any]:
    text = EXPORTS_PAGE
    start = text.index(
        "curl -s http://127.0.0.1:8000/v1/plans/schedule -H 'content-type: application/json' -d '{"
    )
    body = text[text.index("'{", start) + 1 : text.index("}'", start) + 1]
    return dict(json.loads(body))


def test_the_schedule_example_has_a_real_warmup_and_prints_what_is_served(client: TestClient) -> None:
    request = _schedule_example()
    answer = client.post("/v1/plans/schedule", json=request).json()
    printed = _commented(EXPORTS_PAGE, '{"train_steps": 100000')
    assert f'"rampup_steps": {answer["rampup_steps"]}' in printed
    assert f'"steps": {answer["stages"][0]["steps"]}' in printed
    assert answer["schedule"] in printed.replace('"', "")
    lrs = [p["lr"] for p in answer["points"]]
    assert lrs[0] == 0.0 and max(lrs) == 3e-4  # from 0 to the lr: a warmup that warms up
    plan = client.post("/v1/plans", json=request["plan"]).json()
    assert not any("changes nothing" in w for w in plan["warnings"])


def test_one_recipe_end_to_end(client: TestClient, tmp_path: Path) -> None:
    section = _section("## One recipe, end to end")
    recipe = json.loads(
        section[section.index("```json") + 7 : section.index("```", section.index("```json") + 7)]
    )
    lr = client.post("/v1/plans", json=recipe).json()["learning_rate"]
    printed = _commented(section, '"learning_rate"')
    for key in ("lr", "warmup_steps", "milestones", "train_steps", "lr_at_warmup_end", "lr_at_last_step"):
        assert f'"{key}": {json.dumps(lr[key])}' in printed, key
    assert lr["schedule"] in re.sub(r"\s+", " ", printed)
    chart = client.post("/v1/plans/schedule?format=png", json={"plan": recipe})
    assert chart.status_code == 200 and chart.headers["content-type"] == "image/png"
    export = client.post("/v1/plans/export/hf-trainer", json=recipe)
    namespace: dict[str, Any] = {}
    exec(compile(export.text, str(tmp_path / "training_args.py"), "exec"), namespace)
    planned_lr = namespace["planned_lr"]
    shown = _commented(section, "0.0 0.2").split(":")[0].split()
    assert shown == [repr(planned_lr(s)) for s in (0, lr["warmup_steps"], lr["train_steps"] - 1)]
    points = client.post("/v1/plans/schedule", json={"plan": recipe, "max_points": 5000}).json()["points"]
    assert [planned_lr(p["step"]) for p in points] == [p["lr"] for p in points]
