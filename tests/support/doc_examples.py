"""The `curl` examples of the README and of every page under docs/, with their documented
answers, read out of the Markdown (not a test module; tests/ops/test_docs_examples.py runs them).

An example is a `curl` command in a ```sh block (`-d '{...}'` makes it a POST; so do `-d @name.json`
and `-d "{... $(cat name.json) ...}"`, where `name.json` is the ```json block that a line just
above it names in backticks). Its documented
answer is the `# {...}` comment that follows it in the block, or, when there is none, the
```json block right after the sh block. A `curl .../v1/checks/<id>` line only continues the
check above it: its answer is that check's; `curl .../v1/checks/<id>/...` (a run's chart) is
fetched for that check once it finished (`follow_ups`). Answers are abridged (`...`): what they state is
read as `"key": value` pairs and lists, each of which the real answer must hold somewhere.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOST = "http://127.0.0.1:8000"


@dataclass
class Example:
    source: str  # file:line
    method: str
    path: str
    body: Any = None
    answer: str = ""
    check: bool = field(init=False)
    follow_ups: list[str] = field(default_factory=list)  # GETs of the check's own paths, `<id>` in them
    command: str = ""  # the curl command as written

    def __post_init__(self) -> None:
        self.check = self.method == "POST" and self.path == "/v1/checks"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, language, lines) of each fenced block, indentation removed."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        indent, language, start = len(opening.group(1)), opening.group(2), i + 1
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        yield start, language, body
        i += 1


def _named_files(text: str, blocks: list[tuple[int, str, list[str]]]) -> dict[str, Any]:
    """The ```json blocks a page names as files: the last non-empty line above the block says
    `name.json` in backticks (as the README's "as `recipe.json`:")."""
    lines = text.split("\n")
    files = {}
    for start, language, body in blocks:
        above = [line for line in lines[: start - 1] if line.strip()]
        named = re.findall(r"`([\w.-]+\.json)`", above[-1]) if above and language == "json" else []
        if named:
            files[named[-1]] = json.loads("\n".join(body))
    return files


def examples(page: Path) -> list[Example]:
    found: list[Example] = []
    text = page.read_text()
    blocks = list(_blocks(text))
    files = _named_files(text, blocks)
    for n, (start, language, lines) in enumerate(blocks):
        if language != "sh":
            continue
        in_block: list[Example] = []
        last: Example | None = None
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("curl "):
                command, i = _command(lines, i)
                example = _example(command, f"{page.relative_to(ROOT)}:{start + i}", files)
                if example.path.endswith("/<id>"):
                    continue  # the check above, fetched once it finished
                if "/<id>/" in example.path and last is not None:
                    last.follow_ups.append(example.path)  # e.g. the check above's chart
                    continue
                last = example
                in_block.append(example)
                continue
            if line.startswith("# {") and last is not None:
                answer = [line[2:]]
                i += 1
                while i < len(lines) and lines[i].startswith("#  "):
                    answer.append(lines[i][2:])
                    i += 1
                last.answer = "\n".join(answer)
                continue
            i += 1
        following = blocks[n + 1] if n + 1 < len(blocks) else None
        # The answer shown just below, in a json block of its own.
        below = following is not None and following[1] == "json" and following[0] - (start + len(lines)) <= 6
        if in_block and not in_block[-1].answer and below and following is not None:
            in_block[-1].answer = "\n".join(following[2])
        found += in_block
    return found


def _command(lines: list[str], i: int) -> tuple[str, int]:
    """One curl command: its quoted body spans lines until its quote closes, and a line ending in
    a backslash continues on the next."""
    parts = [lines[i]]
    i += 1
    while i < len(lines) and (
        ("'" in parts[0] and "".join(parts).count("'") % 2) or parts[-1].split("#")[0].rstrip().endswith("\\")
    ):
        parts.append(lines[i])
        i += 1
    return "\n".join(parts), i


def _example(command: str, source: str, files: dict[str, Any]) -> Example:
    url = re.search(re.escape(HOST) + r"(\S+?)(?:['\s]|$)", command)
    assert url, f"{source}: a curl without a URL on {HOST}"
    quoted = re.search(r"-d '(.*)'", command, re.DOTALL)
    from_file = re.search(r"-d @([\w.-]+)", command)
    shell = re.search(r'-d "((?:[^"\\]|\\.)*)"', command, re.DOTALL)
    if quoted is not None:
        body = json.loads(quoted.group(1))
    elif from_file is not None:
        body = files[from_file.group(1)]
    elif shell is not None:
        text = shell.group(1).replace('\\"', '"')
        text = re.sub(r"\$\(cat ([\w.-]+)\)", lambda m: json.dumps(files[m.group(1)]), text)
        body = json.loads(text)
    else:
        return Example(source, "GET", url.group(1), command=command)
    return Example(source, "POST", url.group(1), body, command=command)


# ----------------------------------------------------------------------------- answers

ELLIPSIS = object()  # `...` in a documented list: any items there
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_SCALAR = rf'{_NUMBER}|true|false|null|"(?:[^"\\]|\\.)*"'
_PAIR = re.compile(rf'"([\w.]+)":\s*({_SCALAR})(?=\s*[,}}\]])')
_LIST = re.compile(rf'"([\w.]+)":\s*\[\s*((?:(?:{_SCALAR}|\.\.\.)\s*,?\s*)+)\]')


def stated(answer: str) -> tuple[list[tuple[str, Any]], list[tuple[str, list[Any]]]]:
    """The `"key": value` pairs and the `"key": [values]` lists an abridged answer states;
    `...` stands for what it leaves out. Timings are left out: they are the machine's."""
    answer = re.sub(r'"timings_s":\s*\{[^{}]*\}', "", answer)
    pairs = [(k, json.loads(v)) for k, v in _PAIR.findall(answer)]
    lists = []
    for key, items in _LIST.findall(answer):
        # `...` or "..." stands for items left out.
        found = re.findall(rf"{_SCALAR}|\.\.\.", items)
        values = [ELLIPSIS if v in ("...", '"..."') else json.loads(v) for v in found]
        lists.append((key, values))
    return pairs, lists


def values_at(document: Any, key: str, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (path, value) of `key` in a JSON document."""
    if isinstance(document, dict):
        for k, v in document.items():
            if k == key:
                yield (*path, k), v
            yield from values_at(v, key, (*path, k))
    elif isinstance(document, list):
        for item in document:
            yield from values_at(item, key, path)


def same(documented: Any, real: Any) -> bool:
    """A documented value against the real one: strings ending in `...` are prefixes; numbers
    hold to the digits written (1.0 is 0.95 to 1.05), and a round-off figure (below 1e-10, such
    as a rel_l2 of 1.2e-16) holds for any value that small, which differs between machines."""
    if isinstance(documented, str) and isinstance(real, str):
        # Each `...` in a documented string stands for any text there.
        fragments = [re.escape(f) for f in re.split(r"\s*\.\.\.\s*", documented)]
        return re.fullmatch(r"\s*.*?\s*".join(fragments), real, re.DOTALL) is not None
    if isinstance(documented, bool) or documented is None:
        return real is documented
    if isinstance(documented, int) and isinstance(real, int) and not isinstance(real, bool):
        return real == documented
    if isinstance(documented, (int, float)) and isinstance(real, (int, float)) and not isinstance(real, bool):
        if 0 < abs(documented) < 1e-10:
            return abs(real) < 1e-10
        return math.isclose(real, documented, abs_tol=_half_digit(documented))
    return False


def _half_digit(value: float) -> float:
    """Half a unit in the last digit written: 0.56 -> 0.005, 3.0 -> 0.05, 1e-10 -> 5e-11."""
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def mismatches(answer: str, real: Any) -> list[str]:
    """What the documented answer states that the real one does not."""
    out = []
    pairs, lists = stated(answer)
    for key, documented in pairs:
        found = list(values_at(real, key))
        if not any(same(documented, v) for _, v in found):
            out.append(f"{key}: documented {documented!r}, real {[v for _, v in found][:4]!r}")
    for key, documented_list in lists:
        found_lists = [v for _, v in values_at(real, key) if isinstance(v, list)]
        if not any(_in_order(documented_list, v) for v in found_lists):
            shown = ["..." if d is ELLIPSIS else d for d in documented_list]
            out.append(f"{key}: documented {shown!r}, real {found_lists[:2]!r}")
    return out


def _in_order(documented: list[Any], real: list[Any]) -> bool:
    """The documented items are the real list's, in order, `...` standing for any run of them."""
    if not documented:
        return not real
    head, rest = documented[0], documented[1:]
    if head is ELLIPSIS:
        return any(_in_order(rest, real[k:]) for k in range(len(real) + 1))
    return bool(real) and same(head, real[0]) and _in_order(rest, real[1:])
