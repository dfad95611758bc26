"""Prometheus metrics of one app instance, in a registry of its own.

A per-app `CollectorRegistry` (not the process-global default) lets tests build many apps in one
process without "duplicated timeseries" errors. Job counts are read from the database at scrape
time, so every replica reports the same queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from models import Job, JobStatus

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class JobsCollector(Collector):
    def __init__(self, factory: Callable[[], sessionmaker[Session] | None]) -> None:
        self._factory = factory

    def describe(self) -> Iterator[Metric]:
        """Names only, so registering the collector does not touch the database."""
        yield GaugeMetricFamily("stratagem_jobs", "Jobs in the database by status", labels=["status"])
        yield GaugeMetricFamily("stratagem_queue_length", "Jobs waiting for a worker")

    def collect(self) -> Iterator[Metric]:
        factory = self._factory()
        if factory is None:
            return
        try:
            with factory() as session:
                counts = {
                    status: count
                    for status, count in session.execute(select(Job.status, func.count()).group_by(Job.status))
                }
        except Exception:  # a scrape must not fail because the database blinked; the gauges are just absent
            log.exception("could not count jobs for /metrics")
            return
        jobs = GaugeMetricFamily("stratagem_jobs", "Jobs in the database by status", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], float(counts.get(status, 0)))
        yield jobs
        yield GaugeMetricFamily(
            "stratagem_queue_length", "Jobs waiting for a worker", value=float(counts.get(JobStatus.queued, 0))
        )


class ServiceMetrics:
    def __init__(self, factory: Callable[[], sessionmaker[Session] | None]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "stratagem_http_requests", "HTTP requests handled", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "stratagem_http_request_duration_seconds",
            "Time to answer an HTTP request",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(JobsCollector(factory))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
