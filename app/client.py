"""A small typed client of the batchplan HTTP API (CONTRACT.md, v1), for tooling and the CLI.

    from app.client import BatchplanClient, ProblemError

    with BatchplanClient("http://127.0.0.1:8000", api_key="...") as client:
        plan = client.plan({"topology": {"num_nodes": 2, "gpus_per_node": 8}, "global_batch_size": 512})
        script = client.export("torchrun", body, script="train.py")
        job = client.submit_check({"plan": body, "backend": "gloo"})
        job = client.wait_check(job["id"], timeout=300)

Every 4xx/5xx answer raises `ProblemError` with the RFC 9457 body (`detail`, `errors`,
`suggestions`); a 429 also carries `retry_after`. A server that cannot be reached raises
`UnreachableError`; `wait_check` past its timeout raises `CheckTimeout`. Plain dicts in and
out: no pydantic here, so it imports fast and has only httpx as a dependency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal, Self, overload
from urllib.parse import quote

import httpx

__all__ = [
    "FINISHED",
    "BatchplanClient",
    "BatchplanError",
    "CheckTimeout",
    "ProblemError",
    "UnreachableError",
]

FINISHED = frozenset({"succeeded", "failed", "cancelled"})
DEFAULT_TIMEOUT_S = 30.0

Json = dict[str, Any]
ProgressCallback = Callable[[Json, float], None]


class BatchplanError(Exception):
    """Anything the client could not do."""


class ProblemError(BatchplanError):
    """The server answered 4xx/5xx; `problem` is its problem+json body."""

    def __init__(self, status: int, problem: Mapping[str, Any], retry_after: float | None = None) -> None:
        self.status = status
        self.problem: Json = dict(problem)
        self.retry_after = retry_after
        super().__init__(f"{status}: {self.detail}")

    @property
    def detail(self) -> str:
        return str(self.problem.get("detail") or self.problem.get("title") or f"HTTP {self.status}")

    @property
    def errors(self) -> list[Json]:
        errors = self.problem.get("errors")
        return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []

    @property
    def suggestions(self) -> dict[str, list[Any]]:
        suggestions = self.problem.get("suggestions")
        if not isinstance(suggestions, dict):
            return {}
        return {str(k): list(v) for k, v in suggestions.items() if isinstance(v, list)}


class UnreachableError(BatchplanError):
    """No HTTP answer at all: connection refused, DNS, timeout."""


class CheckTimeout(BatchplanError):
    """`wait_check` gave up; `job` is the last state seen (the check may still finish)."""

    def __init__(self, job: Json, waited_s: float) -> None:
        self.job = job
        self.waited_s = waited_s
        super().__init__(
            f"check {job.get('id')} is still {job.get('status')} after {waited_s:.0f} s; "
            f"see GET /v1/checks/{job.get('id')}"
        )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare enough not to parse


def _problem(response: httpx.Response) -> ProblemError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = response.text.strip()
        body = {
            "title": response.reason_phrase or "HTTP error",
            "status": response.status_code,
            "detail": text[:500] if text else f"HTTP {response.status_code} {response.reason_phrase}",
        }
    return ProblemError(response.status_code, body, _retry_after(response))


class BatchplanClient:
    """Synchronous client; a context manager that closes its connection pool.

    `transport` (e.g. `httpx.MockTransport`, `httpx.ASGITransport`) or a ready `http_client`
    (e.g. `fastapi.testclient.TestClient(app)`) can be injected; an injected `http_client`
    is not closed by this client.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Accept": "application/json, application/problem+json;q=0.9, */*;q=0.5"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._owned = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout, transport=transport)

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        """One call; a status outside `ok` raises ProblemError."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method,
                self.base_url + path,
                json=json,
                params=query or None,
                headers=self._headers,
            )
        except httpx.TransportError as err:
            raise UnreachableError(f"cannot reach {self.base_url}: {err or type(err).__name__}") from err
        if response.status_code not in ok:
            raise _problem(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Json:
        response = self.request(method, path, **kwargs)
        try:
            data = response.json()
        except ValueError as err:
            raise ProblemError(
                response.status_code,
                {"title": "Not JSON", "detail": f"{method} {path} answered {response.text[:200]!r}"},
            ) from err
        if not isinstance(data, dict):
            raise ProblemError(response.status_code, {"detail": f"{method} {path} answered a non-object"})
        return data

    # ------------------------------------------------------------------ planner

    def plan(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/plans."""
        return self._json("POST", "/v1/plans", json=body)

    def export(self, fmt: str, body: Mapping[str, Any], **options: Any) -> str:
        """POST /v1/plans/export/{fmt}; options: script, job_name, image, port."""
        return self.request("POST", f"/v1/plans/export/{_segment(fmt)}", json=body, params=options).text

    @overload
    def schedule(self, body: Mapping[str, Any], format: Literal["json"] | None = None) -> Json: ...

    @overload
    def schedule(self, body: Mapping[str, Any], format: Literal["png", "svg"]) -> bytes: ...

    def schedule(self, body: Mapping[str, Any], format: str | None = None) -> Json | bytes:
        """POST /v1/plans/schedule: the series as JSON, or a png/svg chart as bytes."""
        if format in (None, "json"):
            return self._json("POST", "/v1/plans/schedule", json=body)
        return self.request("POST", "/v1/plans/schedule", json=body, params={"format": format}).content

    def elastic(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/plans/elastic."""
        return self._json("POST", "/v1/plans/elastic", json=body)

    # ------------------------------------------------------------------ worker

    def submit_check(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/checks: the queued job (202)."""
        return self._json("POST", "/v1/checks", json=body, ok=(200, 201, 202))

    def get_check(self, check_id: str) -> Json:
        return self._json("GET", f"/v1/checks/{_segment(check_id)}")

    def list_checks(self, limit: int | None = None, status: str | None = None) -> list[Json]:
        data = self._json("GET", "/v1/checks", params={"limit": limit, "status": status})
        checks = data.get("checks", [])
        return [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []

    def check_chart(self, check_id: str, chart: str, format: Literal["png", "svg"] = "png") -> bytes:
        """GET /v1/checks/{id}/{chart}.{format}: one of a finished check's charts (trajectory,
        throughput, lr_scaling; 404 for a check whose result has none, 409 while it runs)."""
        return self.request("GET", f"/v1/checks/{_segment(check_id)}/{_segment(chart)}.{format}").content

    def check_trajectory(self, check_id: str, format: Literal["png", "svg"] = "png") -> bytes:
        """GET /v1/checks/{id}/trajectory.{format}: a finished run's chart (404 for a check of
        one step, 409 while it runs)."""
        return self.check_chart(check_id, "trajectory", format)

    def check_throughput(self, check_id: str, format: Literal["png", "svg"] = "png") -> bytes:
        """GET /v1/checks/{id}/throughput.{format}: a finished check's measured curve (404 for a
        check that measured none, 409 while it runs)."""
        return self.check_chart(check_id, "throughput", format)

    def check_lr_scaling(self, check_id: str, format: Literal["png", "svg"] = "png") -> bytes:
        """GET /v1/checks/{id}/lr_scaling.{format}: a finished lr-scaling probe's chart (404 for
        a check that was not one, 409 while it runs)."""
        return self.check_chart(check_id, "lr_scaling", format)

    def cancel_check(self, check_id: str) -> Json:
        """DELETE /v1/checks/{id}; 409 (ProblemError) when it already finished."""
        return self._json("DELETE", f"/v1/checks/{_segment(check_id)}")

    def wait_check(
        self,
        check_id: str,
        timeout: float = 600.0,
        poll: float = 0.5,
        on_progress: ProgressCallback | None = None,
    ) -> Json:
        """Poll until the check is succeeded, failed or cancelled; returns that job.

        `on_progress(job, elapsed_s)` is called after every poll. Raises CheckTimeout after
        `timeout` seconds (the check keeps running on the server)."""
        started = time.monotonic()
        while True:
            job = self.get_check(check_id)
            elapsed = time.monotonic() - started
            if on_progress is not None:
                on_progress(job, elapsed)
            if job.get("status") in FINISHED:
                return job
            if elapsed >= timeout:
                raise CheckTimeout(job, elapsed)
            time.sleep(max(0.01, min(poll, timeout - elapsed)))

    def host(self) -> Json:
        """GET /v1/host: GPUs, backends and warm processes of the worker."""
        return self._json("GET", "/v1/host")


def _segment(value: str) -> str:
    """A path segment, percent-encoded ('/' included)."""
    return quote(value, safe="")
