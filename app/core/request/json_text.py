"""JSON text as batchplan reads it, from a request body or a request file: `json.loads`, with
each way the bytes can fail to be JSON turned into a `JSONDecodeError` with its message and
place (bytes that are not UTF-8, nesting deeper than the parser's recursion), and integers too
long to convert read as the infinity that `1e400` gives, for the schema to refuse at their
field. Standard library only: the API's routes and the CLI share it."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

# A JSON string (skipped whole, brackets inside it do not nest) or a bracket.
_TOKENS = re.compile(rb'"(?:\\.|[^"\\])*"|[][{}]')


def parse(body: bytes) -> Any:
    """The body's JSON, as `json.loads` reads it; a `JSONDecodeError` for anything that is not."""
    try:
        return json.loads(body)
    except UnicodeDecodeError as err:
        raise _not_text(body, err) from None
    except RecursionError:
        raise _too_deep(body) from None
    except json.JSONDecodeError:
        raise
    except ValueError as err:
        if "integer string conversion" not in str(err):
            raise
    # More digits than int() converts (sys.get_int_max_str_digits): a number beyond every
    # bound of the contract, which the schema then refuses at its field, as it does 1e400.
    return json.loads(body, parse_int=_integer)


def _integer(text: str) -> int | float:
    limit = sys.get_int_max_str_digits()
    if limit and len(text.lstrip("-")) > limit:
        return -math.inf if text.startswith("-") else math.inf
    return int(text)


def _not_text(body: bytes, err: UnicodeDecodeError) -> json.JSONDecodeError:
    """The byte that does not decode, at its place in the text before it."""
    document = body.decode(err.encoding, "replace")
    position = len(body[: err.start].decode(err.encoding, "replace"))
    bad = " ".join(f"0x{b:02x}" for b in body[err.start : err.end])
    what = f"byte {bad} is" if err.end - err.start == 1 else f"bytes {bad} are"
    name = err.encoding.upper().replace("_", "-")
    return json.JSONDecodeError(f"{what} not {name} ({err.reason})", document, position)


def _too_deep(body: bytes) -> json.JSONDecodeError:
    """Where the nesting is deepest, or where it reaches the recursion limit, past which the
    parser (once a level) cannot have gone: the scan stops there."""
    limit = sys.getrecursionlimit()
    depth = deepest = at = 0
    for token in _TOKENS.finditer(body):
        if token.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest, at = depth, token.start()
                if deepest >= limit:
                    break
        elif token.group() in (b"]", b"}"):
            depth -= 1
    document = body.decode("utf-8", "replace")
    position = len(body[:at].decode("utf-8", "replace"))
    how = f"at least {deepest}" if deepest >= limit else str(deepest)
    return json.JSONDecodeError(
        f"arrays and objects nested {how} deep, more than the parser takes", document, position
    )
