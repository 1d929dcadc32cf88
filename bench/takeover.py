"""P8: two operator replicas on hollow nodes, the leader SIGKILLed while every job scales
out: how soon the standby takes over, and whether every scale still ends once and well."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from bench.common import Row, hollow
from localcluster.manifests import job, scaleout
from localcluster.operatorproc import OperatorProcess
from localcluster.world import Hollow, wait_for

LEASE_NS = "etoperator-system"


def replicas(c: Hollow) -> dict[str, OperatorProcess]:
    """Two replicas with leader election, in place of the cluster's one operator."""
    c.operator.stop()
    base = c.operator
    pair = {
        n: OperatorProcess(base.kubeconfig, base.log.with_name(f"{n}.log"), base.ssh_port,
                           extra=[*base.extra, "--leader-election", "--lease-namespace", LEASE_NS],
                           env={"POD_NAME": n})
        for n in ("replica-a", "replica-b")
    }  # fmt: skip
    for proc in pair.values():
        proc.start()
    return pair


def holder(c: Hollow) -> str:
    lease = c.api.get("Lease", LEASE_NS, "etoperator") or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def p8(tmp: Path, jobs: int = 10) -> list[Row]:
    """Two replicas; the leader SIGKILLed while every job scales out."""
    c = hollow(tmp, jobs * 4)
    try:
        pair = replicas(c)
        leader = wait_for(partial(holder, c), 30)
        ns = c.new_namespace()
        for i in range(jobs):
            c.create(job(f"h{i}", replicas=2, maxReplicas=4), ns)
        wait_for(lambda: all(c.phase(ns, f"h{i}") == "Running" for i in range(jobs)), 300,
                 interval=1)  # fmt: skip
        for node in c.nodes():  # the new workers stay Pending until the leader is killed
            c.kubectl("cordon", node)
        for i in range(jobs):
            c.create(scaleout(f"grow{i}", f"h{i}", 1), ns)
        wait_for(lambda: all(c.status(ns, f"grow{i}", "ScaleOut").get("addPods")
                             for i in range(jobs)), 60)  # fmt: skip
        pair[leader].kill()
        killed = time.monotonic()
        for node in c.nodes():
            c.kubectl("uncordon", node)
        wait_for(lambda: holder(c) not in ("", leader), 60, interval=0.1)
        took_over = time.monotonic() - killed
        done = partial(lambda: all(c.phase(ns, f"grow{i}", "ScaleOut") == "ScaleSucceeded"
                                   for i in range(jobs)))  # fmt: skip
        wait_for(done, 60, interval=0.2)
        finished = time.monotonic() - killed
        damage = harm(c, ns, jobs)
        for proc in pair.values():
            proc.stop()
        return [
            ("P8", "leader SIGKILLed mid-scale: standby holds the Lease after",
             f"{took_over:.1f}s", "<= 15 s"),
            ("P8", f"... and all {jobs} in-flight ScaleOuts succeeded after", f"{finished:.1f}s",
             ""),
            ("P8", "duplicate / orphan pods, stuck scalers", damage, "0 / 0 / 0"),
        ]  # fmt: skip
    finally:
        c.stop()


def harm(c: Hollow, ns: str, jobs: int) -> str:
    """Duplicate / orphan worker pods and stuck scalers over the jobs."""
    duplicates = orphans = stuck = 0
    for i in range(jobs):
        target = c.status(ns, f"h{i}").get("targetWorkers") or []
        pods = c.pods(ns, f"h{i}", "worker")
        duplicates += max(0, len(pods) - len(set(target)))
        orphans += len(set(pods) - set(target))
        stuck += c.phase(ns, f"grow{i}", "ScaleOut") != "ScaleSucceeded"
    return f"{duplicates} / {orphans} / {stuck}"
