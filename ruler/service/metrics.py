"""The service's Prometheus metrics, in a registry of their own (one per app), served as text at /metrics."""

from __future__ import annotations

import ruler_rl.service.needs_serve  # noqa: F401  (first: a clear error without the serve extra)

# isort: split
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ERROR_KINDS = ("timeout", "bad_request", "judge", "internal")
"""The `kind` label of `ruler_errors_total` (see `ruler_rl.service.judging.Failure`)."""


class Metrics:
    """Requests by route and status, their latency, judge calls, cache hits, failed groups by kind, queue depth."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("ruler_requests_total", "HTTP requests", ["path", "status"], registry=self.registry)
        self.latency = Histogram("ruler_request_seconds", "HTTP request latency", ["path"], registry=self.registry)
        self.judge_calls = Counter("ruler_judge_calls_total", "Judge LLM calls made", registry=self.registry)
        self.cache_hits = Counter("ruler_cache_hits_total", "Groups answered from the judge cache",
                                  registry=self.registry)
        self.errors = Counter("ruler_errors_total", "Groups that failed", ["kind"], registry=self.registry)
        self.queue = Gauge("ruler_queue_depth", "Job groups waiting or running", registry=self.registry)

    def failed(self, kind: str) -> None:
        """Count one group that failed, by the kind of failure (one of `ERROR_KINDS`)."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; one of {', '.join(ERROR_KINDS)}")
        self.errors.labels(kind).inc()

    def render(self, queue_depth: int) -> str:
        """The Prometheus text exposition, with the queue depth as it is now."""
        self.queue.set(queue_depth)
        return generate_latest(self.registry).decode()
