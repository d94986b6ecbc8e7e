"""`python -m app.worker.gradcheck`: the rank program under the name exports, launch scripts
and docs give it. The program itself is `app.worker.rank.program`."""

from __future__ import annotations

import sys

from app.worker.rank.program import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
