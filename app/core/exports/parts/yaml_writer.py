"""YAML written by hand, to keep the core standard-library only.

Every one-line string is double-quoted, JSON-style, which YAML reads the same; text of several
lines (a container's script) is a literal block scalar (`|`), which a person can read and edit,
where the block says it exactly, else double-quoted too. Floats always carry a decimal point,
because YAML 1.1 reads `1e-08` as a string. The tests parse the output with PyYAML.
"""

from __future__ import annotations

import math
from typing import Any


def _yaml_string(text: str) -> str:
    """A YAML double-quoted scalar that stays printable ASCII: YAML escapes, one per
    character (JSON's surrogate pairs for astral characters are not YAML)."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if not math.isfinite(value):
            raise ValueError(f"no YAML for {value!r}")
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        # YAML 1.1 (PyYAML) wants a signed exponent: 1.0e+20, not 1.0e20.
        if exponent and exponent[0] not in "+-":
            exponent = "+" + exponent
        return mantissa + ("e" + exponent if exponent else "")
    if isinstance(value, str):
        return _yaml_string(value)
    raise TypeError(f"no YAML for {type(value).__name__}")


def _block(text: str) -> tuple[str, list[str]] | None:
    """`text` as a literal block scalar (`|-`): its header and lines; None where only a
    quoted scalar says it exactly.

    A block keeps each character as it is, so it is used only for printable ASCII without
    tabs, with no line ending in a space (a space-only line would read as an empty one) and a
    first line that does not start with one (it would set the block's indentation). Text that
    ends in a line break stays quoted: `|` keeps that break only when a line break follows the
    block, and the document's last line has none until its writer adds it."""
    lines = text.split("\n")
    if len(lines) < 2 or text.endswith("\n"):
        return None
    if any(not (0x20 <= ord(c) < 0x7F or c == "\n") for c in text):
        return None
    first = next((line for line in lines if line), "")
    if not first or first.startswith(" ") or any(line.endswith(" ") for line in lines):
        return None
    return "|-", lines


def _scalar_lines(head: str, value: Any, pad: str) -> list[str]:
    """`head` (`key:` or `-`) and the value: inline, or a block scalar on the lines below."""
    block = _block(value) if isinstance(value, str) else None
    if block is None:
        return [f"{head} {_flow(value)}"]
    header, lines = block
    # Two spaces deeper than the key or the dash: more than the node that holds the block.
    return [f"{head} {header}", *(f"{pad}  {line}" if line else "" for line in lines)]


# Words YAML 1.1 reads as booleans or null: as plain keys they would not stay strings.
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _plain_key(key: str) -> bool:
    simple = key[:1].isascii() and key[:1].isalpha()
    simple = simple and all(c.isascii() and (c.isalnum() or c in "_./-") for c in key)
    return simple and key.lower() not in _YAML_WORDS


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists and scalars; keys are plain identifiers or quoted."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = key if _plain_key(key) else _yaml_string(key)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{name}:")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines += _scalar_lines(f"{pad}{name}:", item, pad)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                body = to_yaml(item, indent + 2).splitlines()
                lines.append(f"{pad}- {body[0].lstrip()}")
                lines.extend(body[1:])
            elif isinstance(item, list) and item:
                lines.append(f"{pad}-")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines += _scalar_lines(f"{pad}-", item, pad)
    else:
        lines.append(pad + _yaml_scalar(value))
    return "\n".join(lines)


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)
