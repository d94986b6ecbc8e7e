"""Prometheus metrics, one registry per app so that tests and apps never share counts.

Request metrics are labelled by route template (`/v1/checks/{check_id}`), never by path:
anything no route matched is `unmatched`, so a scan of random URLs adds no series. The
worker's queue depth, running checks, checks waited for and warm ranks are read from the service at scrape
time (a custom collector), so they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
UNMATCHED = "unmatched"

CHECK_OUTCOMES = ("succeeded", "failed", "cancelled")
# Any other method (a client may send anything) is counted as OTHER: a bounded label set.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _WorkerCollector:
    """Gauges read from the check service (or zeros while it is disabled or not started)."""

    def __init__(self, service: Callable[[], Any]) -> None:
        self._service = service

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families(None))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families(self._service())

    @staticmethod
    def _families(service: Any) -> Iterator[GaugeMetricFamily]:
        queued = running = waited = warm = busy = size = 0
        if service is not None:
            queued, running, waited = service.queue_depth(), service.running_count(), service.waiting_now()
            warm_ranks = service.runner.warm()
            warm, busy, size = len(warm_ranks), sum(1 for r in warm_ranks if r.busy), service.runner.size
        yield GaugeMetricFamily("batchplan_checks_queued", "Checks waiting in the queue", value=queued)
        yield GaugeMetricFamily("batchplan_checks_running", "Checks running now", value=running)
        yield GaugeMetricFamily(
            "batchplan_checks_waited_for", "Checks that a GET ?wait= request waits for now", value=waited
        )
        yield GaugeMetricFamily("batchplan_warm_ranks", "Warm rank processes", value=warm)
        yield GaugeMetricFamily("batchplan_busy_ranks", "Warm rank processes running a check", value=busy)
        yield GaugeMetricFamily(
            "batchplan_ranks_configured", "Rank processes configured (processes_per_host)", value=size
        )


class Metrics:
    def __init__(self, service: Callable[[], Any] = lambda: None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "batchplan_http_requests",
            "HTTP requests by route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "batchplan_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
        )
        self.checks = Counter(
            "batchplan_checks",
            "Finished gradient checks by status (succeeded/failed/cancelled) and result "
            "(passed: true/false; none when the check did not run to the end)",
            ["status", "passed"],
            registry=self.registry,
        )
        self.check_duration = Histogram(
            "batchplan_check_duration_seconds",
            "Time a gradient check ran, from start to finish, by status",
            ["status"],
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0),
        )
        for status in CHECK_OUTCOMES:  # every series exists from the first scrape, at zero
            self.check_duration.labels(status)
        for passed in ("true", "false"):
            self.checks.labels("succeeded", passed)
        for status in ("failed", "cancelled"):
            self.checks.labels(status, "none")
        self.registry.register(_WorkerCollector(service))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "OTHER"
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def observe_check(self, status: str, passed: bool | None, seconds: float) -> None:
        label = "none" if passed is None else "true" if passed else "false"
        self.checks.labels(status, label).inc()
        self.check_duration.labels(status).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
