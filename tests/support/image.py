"""The Dockerfile read as data: its stages and instructions, the final CMD and HEALTHCHECK,
and the environment the image gives its process, mapped onto this machine."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .servers import ROOT

DOCKERFILE = ROOT / "Dockerfile"
VENV_BIN = Path(sys.executable).parent


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"the stage has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """The stage's ENV settings (`K=V ...` or `K V`), `$VAR` / `${VAR}` left as written."""
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            words = shlex.split(args)
            if words and "=" not in words[0]:
                out[words[0]] = " ".join(words[1:])
                continue
            for word in words:
                key, _, value = word.partition("=")
                out[key] = value
        return out


def logical_lines(text: str) -> list[str]:
    """Instructions with their `\\` continuations joined; comments and blank lines dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1].strip() + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    if current:
        lines.append(current.strip())
    return lines


def parse_dockerfile(path: Path = DOCKERFILE) -> tuple[list[tuple[str, str]], list[Stage]]:
    """(global instructions before the first FROM, the stages in order)."""
    preamble: list[tuple[str, str]] = []
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
        else:
            preamble.append((keyword, args.strip()))
    return preamble, stages


def exec_form(args: str) -> list[str]:
    """An exec-form (JSON array) argument list; anything else fails the test."""
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value), args
    return value
