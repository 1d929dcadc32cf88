"""Q2: shrink instead of evict under the real Kueue (real nodes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.common import Row, fmt
from etoperator import naming
from localcluster.queues import KUEUE, make_queue, queued_job
from localcluster.world import Real, start_real, wait_for


def q2(tmp: Path, rounds: int = 10) -> list[Row]:
    """A job of 4 workers (min 2) fills its ClusterQueue; a job of higher priority needs two
    pods' quota: Kueue evicts the first's surplus, the operator drains its two workers and
    gives the admission back, and Kueue admits the newcomer. Timed from the surplus seen
    Evicted (Kueue's decision) to the newcomer seen Admitted (the quota usable), and from the
    newcomer's creation to its Running; the first job's restarts counted (goal: none)."""
    c = start_real(tmp, nodes=2, kueue=True)
    try:
        ns = c.new_namespace()
        make_queue(c, ns, pods=5, preempt=True)
        for name, value in (("low", 10), ("high", 1000)):
            wpc = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                   "metadata": {"name": f"{name}-{ns}"}, "value": value}  # fmt: skip
            c.kubectl("apply", "-f", "-", input=yaml.safe_dump(wpc))
        seen = watch_workloads(c, ns)
        usable, running, restarts = [], [], 0
        for i in range(rounds):
            low, high = f"low{i}", f"high{i}"
            c.create(prioritised(queued_job(low, replicas=4, minReplicas=2), ns, "low"), ns)
            wait_for(lambda: len(c.hosts(ns, low)) == 4, 120, f"{low} at 4")  # noqa: B023
            t0 = time.monotonic()
            c.create(prioritised(queued_job(high, replicas=1), ns, "high"), ns)
            wait_for(lambda: c.phase(ns, high) == "Running", 120, f"{high} running")  # noqa: B023
            running.append(time.monotonic() - t0)
            got = seen()
            usable.append(got[("Admitted", high)] - got[("Evicted", low)])
            restarts += int(c.status(ns, low).get("restartCount") or 0)
            c.kubectl("delete", "tj", low, high, "-n", ns, "--wait=true")
        return [
            ("Q2", "surplus Evicted (Kueue's decision) -> preemptor Admitted p50 / p95",
             fmt(usable), "<= 3 s p95"),
            ("Q2", "preemptor created -> Running p50 / p95", fmt(running), ""),
            ("Q2", f"restarts of the preempted job over {rounds} rounds", str(restarts), "0"),
        ]  # fmt: skip
    finally:
        c.stop()


def prioritised(body: dict[str, Any], ns: str, level: str) -> dict[str, Any]:
    body["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"{level}-{ns}"
    return body


def watch_workloads(c: Real, ns: str) -> Callable[[], dict[tuple[str, str], float]]:
    """When each job's Workloads were first seen Evicted and Admitted (a watch, as any
    client sees them): by (condition, job)."""
    from kubernetes import client, watch

    seen: dict[tuple[str, str], float] = {}
    api = client.CustomObjectsApi(c.api.api)

    def run() -> None:
        while True:
            try:
                for ev in watch.Watch().stream(
                    api.list_namespaced_custom_object, naming.KUEUE_GROUP,
                    naming.KUEUE_VERSION, ns, "workloads", timeout_seconds=300,
                ):  # fmt: skip
                    body = ev["object"]
                    job = body["metadata"]["labels"].get(naming.LABEL_JOB, "")
                    for cond in (body.get("status") or {}).get("conditions") or []:
                        if cond["status"] == "True" and cond["type"] in ("Evicted", "Admitted"):
                            seen.setdefault((cond["type"], job), time.monotonic())
            except Exception:  # a watch that ends is opened again
                time.sleep(0.1)

    threading.Thread(target=run, daemon=True).start()
    return lambda: dict(seen)
