"""P10 and HA: scaling latency on real nodes, and the operator's hand-over between replicas."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Row, fmt, in_phase, on_real_nodes, pct
from localcluster.manifests import job, scaleout
from localcluster.world import (
    Chain,
    start_chain,
    wait_for,
)


def p10(tmp: Path, rounds: int = 20) -> list[Row]:
    """The operator's own latency on real nodes, against the Go operator's medians measured on
    this machine kind (it checks nothing: no sshd probe, no name or bound checks): a job's
    launcher created after its workers run, and a ScaleOut's new host listed and succeeded
    after its pod runs. Polled every 50 ms through the API (a pod's Running is when the kubelet
    reported its container started: sshd's own start comes after)."""
    c = start_chain(tmp / "chain")
    figures: list[tuple[float, float, float]] = []
    try:
        ns = c.new_namespace()
        for i in range(rounds):
            figures.append(p10_round(c, ns, f"p10-{i}"))
            c.kubectl("delete", "tj", f"p10-{i}", "-n", ns, "--wait=false")
    finally:
        c.stop()
    launch, listed, done = (list(v) for v in zip(*figures, strict=True))

    def p50_p95(v: list[float]) -> str:
        return f"p50 {pct(v, 0.5):.2f}s, p95 {pct(v, 0.95):.2f}s ({len(v)} rounds)"

    return [
        ("P10", "job created -> launcher created, beyond its workers Running", p50_p95(launch),
         "<= 1.5 s (Go operator 1.39 s from creation)"),
        ("P10", "ScaleOut -> new host listed, beyond its pod Running", p50_p95(listed),
         "<= 0.5 s (Go 0.41 s to succeeded)"),
        ("P10", "ScaleOut -> ScaleSucceeded, beyond its pod Running", p50_p95(done), "<= 1 s"),
    ]  # fmt: skip


def p10_round(c: Chain, ns: str, name: str) -> tuple[float, float, float]:
    """(launcher created, new host listed, ScaleOut succeeded), each in seconds beyond the
    pods the operator waited for being Running."""
    t0 = time.monotonic()
    c.create(on_real_nodes(job(name, replicas=2, maxReplicas=3)), ns)
    workers = [f"{name}-worker-{i}" for i in range(2)]
    up = wait_for(lambda: in_phase(c, ns, workers), 120, "workers Running", 0.05)
    wait_for(lambda: c.api.get("Pod", ns, f"{name}-launcher"), 60, "the launcher", 0.05)
    launch = time.monotonic() - max(t0, up)
    t1 = time.monotonic()
    c.create(scaleout(f"{name}-grow", name, 1), ns)
    new = f"{name}-worker-2"
    up = wait_for(lambda: in_phase(c, ns, [new]), 60, "the new worker Running", 0.05)
    wait_for(lambda: new in c.hosts(ns, name), 60, "the new host listed", 0.05)
    listed = time.monotonic() - max(t1, up)
    grow = f"{name}-grow"
    wait_for(lambda: c.phase(ns, grow, "ScaleOut") == "ScaleSucceeded", 60, "success", 0.05)
    return launch, listed, time.monotonic() - max(t1, up)


def ha(tmp: Path, rounds: int = 3) -> list[Row]:
    """The seams of the operator's HA, as deploy/ runs it (two replicas, leader election) on a
    real node: how long the Lease goes unheld when its holder's pod is deleted (graceful: it
    releases the Lease) or its processes are killed (the standby waits out the Lease), and how
    long a ScaleOut made 1 s after an apiserver restart takes beyond its new pod Running."""
    c = start_chain(tmp / "chain")
    graceful: list[float] = []
    killed: list[float] = []
    after_restart: list[float] = []
    try:
        ns = c.new_namespace()
        for i in range(rounds):
            graceful.append(
                hand_over(
                    c,
                    lambda pod: c.kubectl(
                        "delete", "pod", "-n", "etoperator-system", pod, "--wait=false"
                    ),
                )
            )
            killed.append(hand_over(c, lambda pod: c.local.kill_pod("etoperator-system", pod)))
            after_restart.append(scale_after_restart(c, ns, f"ha-{i}"))
    finally:
        c.stop()
    return [
        ("HA", "leader pod deleted -> the standby holds the Lease", fmt(graceful), "<= 3 s"),
        ("HA", "leader killed -> another replica holds the Lease", fmt(killed), "<= 15 s"),
        ("HA", "ScaleOut 1 s after an apiserver restart -> succeeded, beyond its pod Running",
         fmt(after_restart), "<= 2 s"),
    ]  # fmt: skip


def hand_over(c: Chain, stop: Callable[[str], object]) -> float:
    """Seconds from stopping the leader's pod (by `stop`) to a live replica renewing the Lease
    (a killed container comes back in the same pod, with the same identity: it may win)."""
    leader = wait_for(lambda: c.operator.leader(), 60, "a leader")
    wait_for(lambda: [p for p in operator_pods_ready(c) if p != leader], 120, "a standby ready")
    t0, stopped = time.monotonic(), datetime.now(UTC)
    stop(leader)
    wait_for(lambda: renewed_after(c, stopped), 60, "the Lease renewed", 0.05)
    return time.monotonic() - t0


def renewed_after(c: Chain, when: datetime) -> bool:
    lease = c.api.get("Lease", "etoperator-system", "etoperator") or {}
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    if not spec.get("holderIdentity") or not renewed:
        return False
    return datetime.fromisoformat(str(renewed).replace("Z", "+00:00")) > when


def operator_pods_ready(c: Chain) -> list[str]:
    out = c.kubectl(
        "get", "pods", "-n", "etoperator-system", "-l", "app.kubernetes.io/name=etoperator",
        "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="
        "'Ready')].status} {.metadata.deletionTimestamp}{'\\n'}{end}",
    ).stdout  # fmt: skip
    return [f[0] for f in (line.split() for line in out.splitlines()) if f[1:] == ["True"]]


def scale_after_restart(c: Chain, ns: str, name: str) -> float:
    c.create(on_real_nodes(job(name, replicas=1, maxReplicas=2)), ns)
    wait_for(lambda: c.phase(ns, name) == "Running", 120, "the job running")
    assert c.local.cp is not None
    c.local.cp.kill_apiserver()
    c.local.cp.start_apiserver()
    time.sleep(1)  # the figure's own gap: a scale made 1 s after the apiserver is back
    t1 = time.monotonic()
    c.create(scaleout(f"{name}-grow", name, 1), ns)
    new = f"{name}-worker-1"
    up = wait_for(lambda: in_phase(c, ns, [new]), 120, "the new worker Running", 0.05)
    grow = f"{name}-grow"
    wait_for(lambda: c.phase(ns, grow, "ScaleOut") == "ScaleSucceeded", 120, "success", 0.05)
    c.kubectl("delete", "tj", name, "-n", ns, "--wait=false")
    return time.monotonic() - max(t1, up)
