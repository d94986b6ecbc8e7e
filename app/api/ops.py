"""Health, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.metrics import CONTENT_TYPE

router = APIRouter(tags=["operations"])


@router.get("/livez", summary="The process is alive")
async def livez() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Ready to serve")
def readyz(request: Request, response: Response) -> dict[str, object]:
    """Ready when the planner is and, on a server with the worker, every rank process is
    warm; otherwise 503 with the reason (`warming` while ranks start or are replaced, `worker
    unavailable` while none can start, `shutting down`), so that a load balancer sends
    checks elsewhere. The planner answers either way (`planner: true`)."""
    service = getattr(request.app.state, "checks", None)
    if service is not None and service.shutting_down:
        response.status_code = 503
        return {"status": "shutting down", "planner": True, "worker": {"enabled": True, "ready": False}}
    error = getattr(request.app.state, "worker_error", None)
    if error is not None:
        # The deployment asked for a worker and has none: not ready for checks.
        response.status_code = 503
        return {
            "status": "worker unavailable",
            "planner": True,
            "worker": {"enabled": True, "ready": False, "error": error},
        }
    worker: dict[str, object] = {"enabled": service is not None}
    if service is not None:
        host = service.host()
        worker |= {
            "ready": host.ready,
            "warm_processes": host.warm_processes,
            "processes_per_host": host.processes_per_host,
        }
        if not host.ready:
            response.status_code = 503
            if host.failing is not None:
                return {
                    "status": "worker unavailable",
                    "planner": True,
                    "worker": worker | {"error": host.failing},
                }
            return {
                "status": "warming",
                "planner": True,
                "worker": worker | {"reason": host.not_ready_reason},
            }
    return {"status": "ready", "planner": True, "worker": worker}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
