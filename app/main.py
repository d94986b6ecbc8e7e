"""The application factory. `uvicorn app.main:app` serves the default settings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.api import ops, plans
from app.api.metrics import Metrics
from app.api.middleware import ServiceMiddleware
from app.api.problems import install_problem_handlers
from app.settings import Settings

DESCRIPTION = """Tells distributed PyTorch jobs how to split their batch: per-replica
micro-batch, gradient accumulation, `DistributedSampler` settings, loss scales and the
scaled learning rate, for homogeneous and mixed GPU clusters. Errors are RFC 9457
`application/problem+json` with the field at fault and the nearest valid values."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield

    app = FastAPI(title="batchplan", version="1.0.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = Metrics()
    install_problem_handlers(app)
    app.include_router(plans.router)
    app.include_router(ops.router)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(ServiceMiddleware, max_body_bytes=settings.max_body_bytes,
                       metrics=app.state.metrics)
    return app


app = create_app()
