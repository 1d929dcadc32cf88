"""G1: gang scheduling through kube-scheduler's Workload API (hollow nodes)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import Row, Timeline, fmt, hollow
from localcluster.manifests import job
from localcluster.world import (
    Hollow,
    wait_for,
)


def g1(tmp: Path, rounds: int = 10, workers: int = 8) -> list[Row]:
    """Gang scheduling (hollow nodes, kube-scheduler's GangScheduling plugin): job created ->
    every worker bound, with and without the gang; a waiting gang -> bound once room frees."""
    c = hollow(tmp, 2 * workers * 4)
    try:
        ns = c.new_namespace()
        tl = Timeline(c, ns)
        took: dict[str, list[float]] = {"plain": [], "gang": []}
        for i in range(rounds):
            for kind in took:
                name = f"{kind}{i}"
                body = job(name, replicas=workers)
                if kind == "gang":
                    body["spec"]["schedulingPolicy"] = {"minAvailable": workers}
                t0 = time.monotonic()
                c.create(body, ns)
                names = [f"{name}-worker-{k}" for k in range(workers)]
                wait_for(lambda: tl.seen(*(("bound", n) for n in names)), 60, f"{name} bound")  # noqa: B023
                took[kind].append(max(tl.at[("bound", n)] for n in names) - t0)
                c.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
        try:
            waited = fmt(g1_waiting(c, ns, tl))
        except AssertionError as exc:  # said as the figure: the first part still counts
            waited = f"failed: {str(exc)[:60]}"
        return [
            ("G1", f"job of {workers} created -> every worker bound, no gang p50 / p95",
             fmt(took["plain"]), ""),
            ("G1", "... with the gang (all or nothing) p50 / p95", fmt(took["gang"]),
             "within 1 s of no gang"),
            ("G1", "a waiting gang: room freed (the placed gang's pods gone) -> every worker bound",
             waited, "<= 5 s"),
        ]  # fmt: skip
    finally:
        c.stop()


def g1_waiting(c: Hollow, ns: str, tl: Timeline, rounds: int = 3) -> list[float]:
    """Two gangs of two workers, each worker 40% of a node's CPU, on one node: the first placed
    whole, the second made then and waiting (no worker bound) until the first is deleted; timed
    from the first gang's last pod gone. (Made together, either may be the one placed: the
    scheduler takes the gangs in its own order.)"""
    node = c.nodes()[0]
    cpu = c.kubectl("get", "node", node, "-o", "jsonpath={.status.allocatable.cpu}").stdout
    milli = int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000
    took = []
    for i in range(rounds):
        first, second = f"first{i}", f"second{i}"
        for name in (first, second):
            body = job(name, replicas=2)
            body["spec"]["schedulingPolicy"] = {"minAvailable": 2}
            pod = body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
            pod["containers"][0]["resources"] = {"requests": {"cpu": f"{milli * 2 // 5}m"}}
            pod["nodeSelector"] = {"kubernetes.io/hostname": node}
            c.create(body, ns)
            workers = [f"{name}-worker-{k}" for k in range(2)]
            if name == first:
                wait_for(lambda: tl.seen(*(("bound", n) for n in workers)), 60, "the first gang")  # noqa: B023
        wait_for(lambda: c.condition(ns, second, "GangPending"), 60, "the second waiting")  # noqa: B023
        assert not any(tl.seen(("bound", n)) for n in workers), "a part of a gang was placed"
        gone = [f"{first}-worker-{k}" for k in range(2)]
        c.kubectl("delete", "tj", first, "-n", ns, "--wait=false")
        wait_for(lambda: tl.seen(*(("bound", n) for n in workers)), 120, "the second gang")  # noqa: B023
        # From the room freed (the first gang's last pod gone, after its grace period) on.
        room = max(tl.at[("deleted", n)] for n in gone)
        took.append(max(tl.at[("bound", n)] for n in workers) - room)
        c.kubectl("delete", "tj", second, "-n", ns, "--wait=true")
        wait_for(lambda: not c.pods(ns, first), 60, "the first gang's pods gone")  # noqa: B023
    return took
