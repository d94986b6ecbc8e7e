"""A real warm RankPool for the worker tests: started, waited for until every rank is warm,
and stopped on every exit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.worker.service.pool import RankPool


@contextlib.asynccontextmanager
async def warm_pool(size: int, timeout_s: float = 90) -> AsyncIterator[RankPool]:
    from app.worker.service.pool import RankPool  # imports torch's side: only where a test runs

    pool = RankPool(size)
    pool.start()
    try:
        async with asyncio.timeout(timeout_s):
            while len(pool.warm()) < size:
                await asyncio.sleep(0.05)
        yield pool
    finally:
        await pool.stop()
