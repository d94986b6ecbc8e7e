"""Health, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.metrics import CONTENT_TYPE

router = APIRouter(tags=["operations"])


@router.get("/livez", summary="The process is alive")
def livez() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Ready to serve")
def readyz(request: Request) -> dict[str, object]:
    return {"status": "ready", "planner": True}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
