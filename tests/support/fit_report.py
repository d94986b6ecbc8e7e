"""`find_max_micro_batch`'s report as the JSON a check's `micro_batch_search` writes of it."""

from __future__ import annotations

from typing import Any

from app.contract.codec import encode
from app.worker.measure.micro_batch_fit import find_max_micro_batch


def found_report(*args: Any, **kwargs: Any) -> dict[str, Any]:
    report: dict[str, Any] = encode(find_max_micro_batch(*args, **kwargs))
    return report
