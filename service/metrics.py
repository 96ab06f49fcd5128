"""Prometheus metrics of one app instance, kept in the app's own registry (no global state).

With more than one worker process (`probsearch serve --workers N`) a scrape of /metrics reaches
one of them, so the serve command gives the workers a shared directory in
PROMETHEUS_MULTIPROC_DIR: prometheus_client then keeps every value in a file per process, and
`render` sums the counters and histograms over all of them and takes each gauge's max (min for
redis_up: down in any worker is down) over the live ones.
"""

import contextlib
import os
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STAGES = ("decode", "encode", "shortlist", "rerank", "uncertainty", "total")

__all__ = ["CONTENT_TYPE_LATEST", "ServiceMetrics"]


@dataclass
class ServiceMetrics:
    """All metrics the service exports; one instance per app, exposed at GET /metrics."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        reg = self.registry
        self.requests = Counter(
            "probsearch_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "status"],
            registry=reg,
        )
        self.request_latency = Histogram(
            "probsearch_request_latency_seconds",
            "Request latency by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=reg,
        )
        self.stage_latency = Histogram(
            "probsearch_stage_latency_seconds",
            "Search pipeline latency by stage.",
            ["stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=reg,
        )
        self.batch_size = Histogram(
            "probsearch_batch_size",
            "Queries processed together by the micro-batcher.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=reg,
        )
        self.cache_hits = Counter("probsearch_cache_hits", "Result cache hits.", registry=reg)
        self.cache_misses = Counter("probsearch_cache_misses", "Result cache misses.", registry=reg)
        self.cache_skips = Counter(
            "probsearch_cache_skips",
            "Lone searches that did not ask the result cache: their key was not one this "
            "process stored or found lately (service.http.search_flow).",
            registry=reg,
        )
        self.rejections = Counter(
            "probsearch_rejections",
            "Queries flagged rejected (their reject score above its threshold).",
            ["gallery"],
            registry=reg,
        )
        self.active_version = Gauge(
            "probsearch_active_index_version",
            "1 for the index version served per gallery.",
            ["modality", "version"],
            registry=reg,
            multiprocess_mode="livemax",
        )
        self.onnx_provider = Gauge(
            "probsearch_onnx_provider",
            "1 for the ONNX Runtime provider of each encoder.",
            ["encoder", "provider"],
            registry=reg,
            multiprocess_mode="livemax",
        )
        self.redis_up = Gauge(
            "probsearch_redis_up",
            "1 while Redis answers, 0 while it is down.",
            registry=reg,
            multiprocess_mode="livemin",
        )
        self.redis_errors = Counter(
            "probsearch_redis_errors",
            "Redis operations that failed (served without Redis).",
            ["component"],
            registry=reg,
        )
        self.index_swaps = Counter(
            "probsearch_index_swaps", "Index versions swapped in.", ["modality"], registry=reg
        )
        # Looked up once: a labels() call per stage and search cost more than the observations.
        self._stage_children = {stage: self.stage_latency.labels(stage=stage) for stage in STAGES}

    def observe_stage(self, stage: str, ms: float) -> None:
        """Record `ms` milliseconds spent in a pipeline stage (one of STAGES)."""
        child = self._stage_children.get(stage)
        if child is None:
            child = self._stage_children[stage] = self.stage_latency.labels(stage=stage)
        child.observe(ms / 1000)

    def set_active_version(self, modality: str, version: str, previous: str | None) -> None:
        """Point the active-version gauge of `modality` at `version`."""
        if previous is not None and previous != version:
            # A worker's file keeps a removed label's last value: 0 there, then gone here.
            self.active_version.labels(modality=modality, version=previous).set(0)
            with contextlib.suppress(KeyError):
                self.active_version.remove(modality, previous)
        self.active_version.labels(modality=modality, version=version).set(1)

    def render(self) -> bytes:
        """The text exposition format served at /metrics: this process's metrics, or every
        worker's when they share a PROMETHEUS_MULTIPROC_DIR."""
        if not shared_directory():
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        multiprocess.MultiProcessCollector(every_worker)
        return generate_latest(every_worker)

    def close(self) -> None:
        """At a worker's exit: its gauges leave the live ones (its counts stay in the sums)."""
        forget_process(os.getpid())


def forget_process(pid: int) -> None:
    """Take process `pid`'s gauges out of the live ones (its counts stay in the sums): at its
    own exit, or from the parent when it died without one (a crash, SIGKILL), so its last
    active version does not stay in /metrics' maximum."""
    if shared_directory():
        multiprocess.mark_process_dead(pid)


def shared_directory() -> str | None:
    """The directory the worker processes share their values in, when there is one."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
