"""The application factory. `uvicorn app.main:app` serves the default settings."""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import importlib.util
import logging
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute

from app.api import check_charts, checks, exports, ops, plans
from app.api.access_log import AccessLogMiddleware
from app.api.deps import require_planner_key
from app.api.docs import CDN_PAGES_OFF, install_docs
from app.api.exposure import warn_once_bound
from app.api.metrics import Metrics
from app.api.middleware import ServiceMiddleware
from app.api.plan_fast_path import PlanFastPath
from app.api.problems import install_problem_handlers
from app.logging_setup import configure_logging
from app.settings import Settings

if TYPE_CHECKING:
    from app.worker.service.runner import CheckRunner
    from app.worker.service.service import CheckService

log = logging.getLogger("batchplan")

DESCRIPTION = """Tells distributed PyTorch jobs how to split their batch: per-replica
micro-batch, gradient accumulation, `DistributedSampler` settings, loss scales and the
scaled learning rate, for homogeneous and mixed GPU clusters. Errors are RFC 9457
`application/problem+json` with the field at fault and the nearest valid values."""

# The order Swagger UI and ReDoc show the operations in: the question the service answers first.
TAGS = [
    {"name": "plans", "description": "A batch split: micro-batch, accumulation, sampler, loss scales, lr."},
    {"name": "exports", "description": "The plan for a launcher or trainer, its schedule, elastic plans."},
    {"name": "checks", "description": "Prove a plan with real torch.distributed gradient checks."},
    {"name": "operations", "description": "Liveness, readiness and metrics."},
]


def operation_id(route: APIRoute) -> str:
    """An operation's id in the OpenAPI document, which generated clients name their functions
    after: the route function's own name (`create_plan`, `get_check`), stable as long as the
    function keeps it, instead of FastAPI's default `create_plan_v1_plans_post`. A rename is a
    breaking change for those clients: tests/api/test_operation_ids.py holds every id."""
    return route.name


def _on_shutdown_signals(callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` on the event loop as soon as SIGTERM or SIGINT arrives, then hand the
    signal on to the server's own handler; returns a function that undoes it.

    uvicorn runs the lifespan shutdown only after it has stopped serving, waited for open
    requests and background tasks; the worker hears of the shutdown here instead, at once,
    before its rank processes (which a group-wide SIGTERM ends too) can be replaced or a new
    check accepted. Only where the server installed Python handlers (uvicorn does) and only
    in the main thread (a TestClient runs the lifespan elsewhere): a default disposition is
    left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    installed: dict[int, Any] = {}

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
            loop.call_soon_threadsafe(callback)
            previous(signum, frame)

        installed[sig] = (handler, previous)
        signal.signal(sig, handler)

    def undo() -> None:
        for sig, (handler, previous) in installed.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous)

    return undo


def _torch_missing() -> bool:
    """Whether torch cannot be imported, found without importing it (the web process never
    does; the planner-only image has no torch at all)."""
    try:
        return importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):
        return True


def _version() -> str:
    """The installed package's version: the schema's `info.version` says which build answers."""
    try:
        return importlib.metadata.version("batchplan")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


async def _start_worker(app: FastAPI, settings: Settings, runner: CheckRunner | None) -> CheckService | None:
    """The started check service, or None with the reason in `app.state.worker_error` when an
    enabled worker cannot start (the planner serves either way)."""
    if not settings.worker_enabled:
        return None
    if runner is None and _torch_missing():
        # The planner-only image, or an install without the `worker` extra: the planner
        # serves and the worker says why it does not, as for an unusable job database.
        app.state.worker_error = (
            "the worker could not start: torch is not installed (install batchplan[worker], "
            "use the worker image, or set BATCHPLAN_WORKER_ENABLED=false)"
        )
        log.error("%s", app.state.worker_error)
        return None
    from app.worker.service.limits import Limits
    from app.worker.service.service import CheckService

    service = None
    try:
        service = CheckService(
            settings.jobs_db, Limits.from_settings(settings), models=settings.model_registry, runner=runner
        )
        service.observers.append(app.state.metrics.observe_check)
        await service.start()
    except (OSError, sqlite3.Error) as err:
        # The planner still serves; the worker says why it does not (503 on /v1/checks*,
        # /readyz) instead of the whole server failing to start.
        app.state.worker_error = f"the worker could not start: job database {settings.jobs_db}: {err}"
        log.error("%s", app.state.worker_error)
        if service is not None:
            await service.stop()
        return None
    return service


# Over 60 lines: the app's wiring (settings, middleware, routers, lifespan) in the order FastAPI
# applies it.
def create_app(settings: Settings | None = None, runner: CheckRunner | None = None) -> FastAPI:
    """The app for `settings`; its checks run on `runner` (default: the warm rank pool)."""
    settings = settings or Settings()
    configure_logging(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The worker starts here, not at import: rank processes warm up in the background
        # while the planner already serves; /readyz and /v1/host tell when they are warm.
        service = await _start_worker(app, settings, runner)
        app.state.checks = service
        undo_signals = _on_shutdown_signals(service.begin_shutdown) if service is not None else None
        # A worker without an API key says so once the server listens beyond loopback.
        warning = asyncio.create_task(warn_once_bound(settings)) if service is not None else None
        if settings.gc_freeze:
            # What startup built lives as long as the process. Out of the collector's way, a
            # full collection walks what requests allocated, not the whole app again: the
            # collections a 10,000-group plan sets off cost it a quarter of its time without
            # this (bench/bench_scaling.py).
            gc.freeze()
        try:
            yield
        finally:
            if settings.gc_freeze:
                gc.unfreeze()  # collectable again: tests run many apps in one process
            if warning is not None:
                warning.cancel()
            if undo_signals is not None:
                undo_signals()
            if service is not None:
                service.begin_shutdown()  # new submissions get 503 while the rest stops
                await service.stop()
            app.state.checks = None

    app = FastAPI(
        title="batchplan",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_tags=TAGS,
        generate_unique_id_function=operation_id,
        **CDN_PAGES_OFF,
    )
    install_docs(app)
    app.state.settings = settings
    app.state.metrics = Metrics(lambda: app.state.checks)
    app.state.checks = None
    app.state.worker_error = None  # why an enabled worker did not start, if it did not
    install_problem_handlers(app)
    # BATCHPLAN_PROTECT_PLANNER: the API key on /v1/plans* too (the worker's routes always
    # require it when it is set; see app.api.checks).
    planner_auth = [Depends(require_planner_key)] if settings.protect_planner else []
    # Swagger lists tags in TAGS' order and each tag's operations in this order: planning first.
    app.include_router(plans.router, dependencies=planner_auth)
    app.include_router(exports.router, dependencies=planner_auth)
    app.include_router(checks.router)
    app.include_router(check_charts.router)
    app.include_router(ops.router)
    if settings.plan_fast_path and not settings.protect_planner:
        # Added first, so innermost: the request-id, metrics, access-log and CORS middleware
        # see the requests it answers as the route's.
        app.add_middleware(PlanFastPath, route=plans.plan_route(), exception_handlers=app.exception_handlers)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(ServiceMiddleware, max_body_bytes=settings.max_body_bytes, metrics=app.state.metrics)
    app.add_middleware(AccessLogMiddleware)  # outermost: times the whole request
    return app


app = create_app()
