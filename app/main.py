"""The application factory. `uvicorn app.main:app` serves the default settings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.api import checks, exports, ops, plans
from app.api.access_log import AccessLogMiddleware
from app.api.docs import install_docs
from app.api.metrics import Metrics
from app.api.middleware import ServiceMiddleware
from app.api.problems import install_problem_handlers
from app.logging_setup import configure_logging
from app.settings import Settings

DESCRIPTION = """Tells distributed PyTorch jobs how to split their batch: per-replica
micro-batch, gradient accumulation, `DistributedSampler` settings, loss scales and the
scaled learning rate, for homogeneous and mixed GPU clusters. Errors are RFC 9457
`application/problem+json` with the field at fault and the nearest valid values."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The worker starts here, not at import: rank processes warm up in the background
        # while the planner already serves; /readyz and /v1/host tell when they are warm.
        service = None
        if settings.worker_enabled:
            from app.worker.service import CheckService, Limits

            service = CheckService(
                settings.jobs_db,
                Limits(
                    max_replicas_per_check=settings.max_replicas_per_check,
                    processes_per_host=settings.processes_per_host,
                    queue_size=settings.queue_size,
                    check_timeout_s=settings.check_timeout_s,
                    concurrent_checks=settings.concurrent_checks,
                ),
            )
            await service.start()
        app.state.checks = service
        try:
            yield
        finally:
            app.state.checks = None
            if service is not None:
                await service.stop()

    app = FastAPI(
        title="batchplan",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_docs(app)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.checks = None
    install_problem_handlers(app)
    app.include_router(exports.router)
    app.include_router(plans.router)
    app.include_router(ops.router)
    app.include_router(checks.router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(ServiceMiddleware, max_body_bytes=settings.max_body_bytes, metrics=app.state.metrics)
    app.add_middleware(AccessLogMiddleware)  # outermost: times the whole request
    return app


app = create_app()
