"""Q2, Q3: shrink instead of evict under the real Kueue (real nodes): the preemptor's wait,
the goodput of a training job under a trace of preemptions, a kill and a whole stop."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.common import Row, fmt
from etoperator import naming
from localcluster.manifests import IMAGE, SHARED
from localcluster.queues import KUEUE, MILLICPU, make_queue, queued_job
from localcluster.tour import Training
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
        prioritised_queue(c, ns)
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


def prioritised_queue(c: Real, ns: str, millicpu: int = MILLICPU) -> None:
    """A queue of `ns` with room for 5 pods that preempts by priority, and its two priority
    classes: "low" (10) and "high" (1000), named for `ns`."""
    make_queue(c, ns, pods=5, preempt=True, millicpu=millicpu)
    for name, value in (("low", 10), ("high", 1000)):
        wpc = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
               "metadata": {"name": f"{name}-{ns}"}, "value": value}  # fmt: skip
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(wpc))


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


TRAIN = "/opt/etoperator/examples/elastic_train.py"


def training_job(name: str, ns: str) -> dict[str, Any]:
    """examples/elastic_train.py at 4 workers (min 2) in the queue, at the low priority, with
    a shared volume to save to: a step every 0.2 s, a commit every 2 steps."""
    body = queued_job(name, replicas=4, minReplicas=2)
    roles = body["spec"]["etReplicaSpecs"]
    roles["launcher"]["template"]["spec"]["containers"][0].update(
        image=IMAGE, imagePullPolicy="Never",
        command=["horovodrun", "-np", "4", "--min-np", "1", "--max-np", "4",
                 "--host-discovery-script", "/etc/edl/discover_hosts.sh", "--cycle-time-ms", "5",
                 "python3", TRAIN, "--steps", "1000000", "--step-sleep", "0.2",
                 "--commit-every", "2"],
    )  # fmt: skip
    worker = roles["worker"]["template"]["spec"]["containers"][0]
    worker.update(image=IMAGE, imagePullPolicy="Never")
    worker.pop("command", None)
    body["spec"]["sharedVolume"] = dict(SHARED)
    return prioritised(body, ns, "low")


def q3(tmp: Path, seconds: float = 360.0, every: float = 90.0) -> list[Row]:
    """Goodput under a trace: the job trains `seconds` undisturbed, then `seconds` again while
    a job of higher priority takes its surplus every `every` seconds for half of it, one
    worker is SIGKILLed a third in and the job is suspended and resumed half-way (a whole
    stop, as an eviction of its core is). Useful work is worker-steps kept (each step counted
    once, at the size it was last taken at: a step taken again after a rollback counts once,
    the time it took again is lost): useful work a second under the trace over the
    undisturbed rate at the job's full size, and over the size it was given (a shrink gives
    work back by design; what is lost beyond that is the cost of the changes). Also the steps
    lost to the whole stop (the last step seen before it less the one resumed from: 0 when the
    save handshake holds)."""
    c = start_real(tmp, nodes=2, kueue=True)
    try:
        ns = c.new_namespace()
        prioritised_queue(c, ns, millicpu=100)
        static = steady_rate(c, ns, "static", seconds)
        kept, lost, shrunk = traced_rate(c, ns, "traced", seconds, every)
        return [
            ("Q3", f"undisturbed: worker-steps a second over {seconds:.0f}s", f"{static:.2f}",
             ""),
            ("Q3", f"under preemptions every {every:.0f}s, a kill, a suspension: useful work",
             f"{100 * kept / static:.1f}% ({kept:.2f}/s)", ""),
            ("Q3", "... the same against the size it was given (the shrinks' share left out)",
             f"{100 * kept / (static * shrunk):.1f}%", ">= 97%"),
            ("Q3", "steps lost to the whole stop (saved as it stopped)", str(lost), "0"),
        ]  # fmt: skip
    finally:
        c.stop()


def started(c: Real, ns: str, name: str) -> tuple[Training, float, int]:
    c.create(training_job(name, ns), ns)
    tr = Training(lambda: c.pod_log(ns, f"{name}-launcher"))
    wait_for(lambda: tr.first_step_at(4, 0), 300, f"{name} at 4", interval=0.5)
    last = tr.read().steps[-1]
    return tr, last[3], last[0]


def work(tr: Training, t0: float, t1: float) -> tuple[float, float]:
    """Worker-steps a second in [t0, t1] (each step once, at the size it was last taken at),
    and the mean size given over the window (its share of the full 4)."""
    last: dict[int, int] = {}
    for step, size, _, t in tr.read().steps:
        if t0 <= t <= t1:
            last[step] = size
    steps = sorted((t, size) for _, size, _, t in tr.steps if t0 <= t <= t1)
    # The size between two steps is the earlier one's (a stop's gap counts at the size before).
    given = sum(a[1] * (b[0] - a[0]) for a, b in itertools.pairwise(steps))
    return sum(last.values()) / (t1 - t0), given / (4 * (t1 - t0))


def steady_rate(c: Real, ns: str, name: str, seconds: float) -> float:
    tr, t0, _ = started(c, ns, name)
    time.sleep(seconds)
    rate, _ = work(tr, t0, time.time())
    c.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
    return rate


def traced_rate(
    c: Real, ns: str, name: str, seconds: float, every: float
) -> tuple[float, int, float]:
    tr, t0, _ = started(c, ns, name)
    end, i, killed, lost = t0 + seconds, 0, False, -1
    while time.time() < end - every:
        high = f"high{i}"
        c.create(prioritised(queued_job(high, replicas=1), ns, "high"), ns)
        time.sleep(every / 2)
        c.kubectl("delete", "tj", high, "-n", ns, "--wait=false")  # its quota frees as it goes
        if not killed and time.time() > t0 + seconds / 3:
            c.kill(ns, c.hosts(ns, name)[-1])
            killed = True
        elif lost < 0 and time.time() > t0 + seconds / 2:
            lost = suspended(c, ns, name, tr)
        time.sleep(every / 2)
        i += 1
    time.sleep(max(end - time.time(), 0))
    rate, given = work(tr, t0, time.time())
    c.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
    return rate, lost, given


def suspended(c: Real, ns: str, name: str, tr: Training) -> int:
    """Suspended until its pods are gone, then resumed: the steps the new run took again."""
    seen = [0]

    def gone() -> bool:
        seen.append(max((s for s, *_ in tr.read().steps), default=0))
        return not c.pods(ns, name, live=False)

    c.api.patch(naming.JOB_KIND, ns, name, {"spec": {"suspend": True}})
    wait_for(gone, 90, "every pod gone", 0.2)
    t = time.time()
    c.api.patch(naming.JOB_KIND, ns, name, {"spec": {"suspend": False}})
    wait_for(lambda: any(x[3] >= t for x in tr.read().steps), 300, "training again", 0.5)
    return max(max(seen) - (tr.resumed or 0), 0)  # the save may follow the last step seen
