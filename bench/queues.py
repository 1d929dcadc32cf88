"""Q1: jobs admitted by the real Kueue (hollow nodes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    HOLLOW_PODS,
    Q1_CPU,
    Row,
    Timeline,
    fmt,
    operator_requests,
    rss_mib,
)
from etoperator import naming
from localcluster.manifests import scalein
from localcluster.world import (
    Hollow,
    World,
    start_hollow,
    wait_for,
)


def admitted_at(c: World, ns: str) -> Callable[[], dict[str, float]]:
    """When each job's Workload was first seen Admitted (a watch, as any client sees it)."""
    import threading

    from kubernetes import client, watch

    seen: dict[str, float] = {}
    api = client.CustomObjectsApi(c.api.api)

    def run() -> None:
        while True:
            try:
                for ev in watch.Watch().stream(
                    api.list_namespaced_custom_object,
                    "kueue.x-k8s.io",
                    "v1beta2",
                    ns,
                    "workloads",
                    timeout_seconds=300,
                ):
                    body = ev["object"]
                    conds = (body.get("status") or {}).get("conditions") or []
                    if any(x["type"] == "Admitted" and x["status"] == "True" for x in conds):
                        job = body["metadata"]["labels"].get(naming.LABEL_JOB, "")
                        seen.setdefault(job, time.monotonic())
            except Exception:  # a watch that ends is opened again
                time.sleep(0.1)

    threading.Thread(target=run, daemon=True).start()
    return lambda: dict(seen)


def q1(tmp: Path, rounds: int = 10, queued: int = 100, room: int = 10) -> list[Row]:
    """Shared clusters (Kueue on hollow nodes): admitted -> first worker created and -> job
    Running; a ScaleIn's end -> a waiting job admitted; `queued` jobs on quota for `room`."""
    from localcluster.queues import make_queue, queued_job, workloads

    c = start_hollow(tmp, 2, HOLLOW_PODS, ["--no-ssh-checks"], kueue=True)
    try:
        ns = c.new_namespace()
        make_queue(c, ns, pods=room * 3, millicpu=Q1_CPU)
        tl, admitted = Timeline(c, ns), admitted_at(c, ns)
        to_worker, to_running = [], []
        for i in range(rounds):
            name = f"a{i}"
            c.create(queued_job(name, replicas=2, millicpu=Q1_CPU), ns)
            wait_for(lambda: c.phase(ns, name) == "Running", 60, interval=0.02)  # noqa: B023
            done = time.monotonic()
            at = admitted()[name]
            to_worker.append(tl.at[("created", f"{name}-worker-0")] - at)
            to_running.append(done - at)
            c.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
        wait_for(lambda: workloads(c, ns) == [], 60, "their Workloads collected")
        freed = q1_scale_in(c, ns, tl, admitted, rounds=5, room=room)
        flow = q1_flow(c, ns, admitted, queued, room)
        return [
            ("Q1", "Workload admitted -> first worker created p50 / p95",
             f"{fmt(to_worker)}", "<= 1 s"),
            ("Q1", "Workload admitted -> job Running p50 / p95", f"{fmt(to_running)}", "<= 3 s"),
            ("Q1", "ScaleIn's victim deleted -> a waiting job admitted p50 / p95",
             f"{fmt(freed)}", "<= 2 s"),
            *flow,
        ]  # fmt: skip
    finally:
        c.stop()


def q1_scale_in(
    c: Hollow, ns: str, tl: Timeline, admitted: Callable[[], dict[str, float]], rounds: int,
    room: int,
) -> list[float]:  # fmt: skip
    """A job holding all the room but one worker's, another waiting for two: a ScaleIn of the
    first by one lets the second in; from the ScaleIn's end to that admission."""
    from localcluster.queues import queued_job, workloads

    took = []
    n = room * 3 - 2  # big's workers: with its launcher, all the room but one pod's
    for i in range(rounds):
        big, small, less = f"big{i}", f"small{i}", f"less{i}"
        c.create(queued_job(big, replicas=n, minReplicas=n - 1, maxReplicas=n, millicpu=Q1_CPU), ns)
        wait_for(lambda: len(c.hosts(ns, big)) == n, 120, f"{big} running")  # noqa: B023
        c.create(queued_job(small, replicas=1, millicpu=Q1_CPU), ns)  # launcher + 1 worker
        wait_for(lambda: c.phase(ns, small) == "Queued", 30, f"{small} queued")  # noqa: B023
        # Nothing runs in a hollow pod to drain: the victim goes at the 1 s timeout.
        c.create(scalein(less, big, count=1, timeout=1), ns)
        wait_for(lambda: small in admitted(), 60, f"{small} admitted")  # noqa: B023
        pods = wait_for(lambda: c.status(ns, less, "ScaleIn").get("toDeletePods") or [])  # noqa: B023
        victim = str(pods[0])
        wait_for(lambda: tl.seen(("deleted", victim)), 30, f"{victim} deleted")  # noqa: B023
        took.append(admitted()[small] - tl.at[("deleted", victim)])
        c.kubectl("delete", "tj", big, small, "-n", ns, "--wait=true")
        wait_for(lambda: workloads(c, ns) == [], 60, "their Workloads collected")
    return took


def q1_flow(
    c: Hollow, ns: str, admitted: Callable[[], dict[str, float]], jobs: int, room: int
) -> list[Row]:
    """`jobs` queued at once on quota for `room`: each deleted once Running (hollow pods never
    end), which lets the next in. Admissions a minute, the last one's wait, the operator's RSS
    and requests."""
    from localcluster.queues import queued_job

    t0, wall0 = time.monotonic(), time.time()
    for i in range(jobs):
        c.create(queued_job(f"f{i}", replicas=2, millicpu=Q1_CPU), ns)
    created = time.monotonic()
    left, rss = set(range(jobs)), 0
    deadline = time.monotonic() + 900
    while left and time.monotonic() < deadline:
        jobs_now = {j["metadata"]["name"]: (j.get("status") or {}).get("phase")
                    for j in c.api.list(naming.JOB_KIND, ns)}  # fmt: skip
        for i in sorted(left):
            if jobs_now.get(f"f{i}") == "Running":
                c.kubectl("delete", "tj", f"f{i}", "-n", ns, "--wait=false")
                left.discard(i)
        rss = max(rss, rss_mib(c.operator.proc))
        time.sleep(0.2)
    took = time.monotonic() - t0
    seen = admitted()
    last = max((seen[f"f{i}"] for i in range(jobs) if f"f{i}" in seen), default=t0) - created
    requests = operator_requests(c, wall0, time.time())
    return [
        ("Q1", f"{jobs} queued on quota for {room}: admissions a minute",
         f"{60 * len([i for i in range(jobs) if f'f{i}' in seen]) / took:.0f}", ">= 100"),
        ("Q1", "... the last one admitted after", f"{last:.1f}s", ""),
        ("Q1", "... operator RSS max / requests a minute",
         f"{rss} MiB / {60 * len(requests) / took:.0f}", "<= 300 MiB"),
        ("Q1", "... jobs never admitted", str(len(left)), "0"),
    ]  # fmt: skip
