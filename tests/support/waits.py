"""Waits on the state of the world a test checks, each with a deadline."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

from localcluster.world import Timeout
from tests.harness import Cluster, wait_for


def running(cluster: Cluster, ns: str, name: str, workers: int = 2) -> None:
    """The job runs, with `workers` in its host list. Alone a job runs within 3 s; beside the
    suite's trainings it took over 30 s once (why was not recorded). A timeout says what
    the job, its pods and their events were."""
    try:
        wait_for(lambda: cluster.phase(ns, name) == "Running", 90, f"{name} Running")
    except Timeout as exc:
        raise Timeout(f"{exc}\n{cluster.describe(ns, name)}") from None
    assert len(cluster.hosts(ns, name)) == workers


def settled(
    cluster: Cluster, ns: str, kind: str, name: str, phase: str, timeout: float = 20
) -> dict[str, Any]:
    """The scaler reached `phase`; its status. A timeout says what its status was."""
    try:
        wait_for(lambda: cluster.phase(ns, name, kind) == phase, timeout, f"{kind} {name} {phase}")
    except Timeout as exc:
        raise Timeout(f"{exc}\n{kind} {name}: {cluster.status(ns, name, kind)}") from None
    return cluster.status(ns, name, kind)


def scrape(cluster: Cluster) -> dict[str, float]:
    """The operator's metrics."""
    url = f"http://127.0.0.1:{cluster.operator.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if m:
            out[m[1]] = float(m[2])
    return out


def passes(cluster: Cluster) -> float:
    """Reconcile passes the operator has made (of all jobs)."""
    return scrape(cluster)["etoperator_reconciles_total"]


def pass_attempts(cluster: Cluster) -> float:
    """Passes made, and those not run because a view did not show the operator's own write
    yet (of all jobs)."""
    got = scrape(cluster)
    return got["etoperator_reconciles_total"] + got.get("etoperator_stale_views_total", 0.0)
