"""Prometheus metrics, served by `etoperator run --metrics-port`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

JOBS = Gauge("etoperator_jobs", "TrainingJobs by phase", ["phase"], registry=REGISTRY)
SCALES = Counter(
    "etoperator_scale_operations_total",
    "Scalers settled, by kind and result",
    ["kind", "result"],
    registry=REGISTRY,
)
SCALE_SECONDS = Histogram(
    "etoperator_scale_duration_seconds",
    "Time from a scaler's start to its end",
    ["kind"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
HOST_UPDATES = Counter(
    "etoperator_hostlist_updates_total", "Host-list (ConfigMap) writes", registry=REGISTRY
)
RECONCILES = Counter("etoperator_reconciles_total", "Reconcile passes", registry=REGISTRY)
STALE_VIEWS = Counter(
    "etoperator_stale_views_total",
    "Passes not run: the caches did not show one of the operator's own writes yet",
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "etoperator_reconcile_errors_total", "Reconcile passes that raised", registry=REGISTRY
)
# 50 ms steps up to 0.5 s: the pass-time goal (p99 <= 0.5 s) is read from these.
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, *(i / 20 for i in range(2, 11)), 1, 2.5, 5)
RECONCILE_SECONDS = Histogram(
    "etoperator_reconcile_duration_seconds",
    "Duration of one reconcile pass",
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)
PASS_WAIT_SECONDS = Histogram(
    "etoperator_pass_wait_seconds",
    "How long a woken job waited for a free thread before its pass, by whether the job had a "
    "phase yet (new jobs take at most two threads at once)",
    ["job"],
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)
PASS_STEP_SECONDS = Histogram(
    "etoperator_pass_step_seconds",
    "Duration of each step of a pass: basics (the job's Secret and ConfigMap; its launcher's "
    "RBAC asked for), views (pods and scalers read from the caches), plan, writes (scaler and "
    "job status, spec replicas), children (host list, pods, Services, scalers)",
    ["step"],
    buckets=PASS_BUCKETS,
    registry=REGISTRY,
)


@contextlib.contextmanager
def pass_step(took: dict[str, float], step: str) -> Iterator[None]:
    """Time a step of a pass into PASS_STEP_SECONDS and into `took` (a slow pass logs it)."""
    start = time.monotonic()
    try:
        yield
    finally:
        took[step] = time.monotonic() - start
        PASS_STEP_SECONDS.labels(step).observe(took[step])


WORKERS_REPLACED = Counter(
    "etoperator_workers_replaced_total",
    "Lost workers replaced under a new index",
    registry=REGISTRY,
)
WORKERS_LOST = Counter(
    "etoperator_workers_lost_total",
    "Workers that left the host list unplanned",
    registry=REGISTRY,
)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
