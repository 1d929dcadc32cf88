"""Q3a: the digits job (a real data set, a test accuracy) queued in the real Kueue at 4
workers (min 2), run to its end undisturbed and again under a trace of preemptions and a
killed worker: its accuracy against the undisturbed run's, and its training rate against the
size it was given."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from bench.common import Row
from bench.preempt import prioritised, prioritised_queue
from etoperator import naming
from localcluster import digits
from localcluster.queues import MILLICPU, queued_job
from localcluster.world import Real, start_real, wait_for

EPOCHS = 150  # about 4 minutes at 4 workers here: several preemptions long


def digits_job(name: str, ns: str, epochs: int) -> dict[str, Any]:
    """examples/training_job_digits.yaml as shipped, but queued at the low priority at 4
    workers (min 2): Kueue may take the two above the minimum back at any time."""
    body = digits.manifest(epochs)
    body["metadata"] = {"name": name, "labels": {naming.LABEL_QUEUE: "lq"}}
    roles = body["spec"]["etReplicaSpecs"]
    cmd = roles["launcher"]["template"]["spec"]["containers"][0]["command"]
    cmd[cmd.index("-np") + 1], cmd[cmd.index("--min-np") + 1] = "4", "2"
    roles["worker"].update(replicas=4, minReplicas=2, maxReplicas=4)
    for role in ("launcher", "worker"):
        first = roles[role]["template"]["spec"]["containers"][0]
        first["resources"] = {"requests": {"cpu": f"{MILLICPU}m"}}
    return prioritised(body, ns, "low")


def given(run: digits.Run) -> tuple[float, float]:
    """Epochs a second between the first and the last epoch's end, and the mean size the job
    trained at over that time (each epoch at the size it ended at), as a share of 4."""
    e = run.epochs
    if len(e) < 2:
        return float("nan"), float("nan")
    span = e[-1].t - e[0].t
    sizes = sum(b.size * (b.t - a.t) for a, b in itertools.pairwise(e))
    return (len(e) - 1) / span, sizes / (4 * span)


def finished(c: Real, ns: str, name: str, trace: float = 0.0) -> digits.Run:
    """Created and waited for to its end; with `trace`, a job of higher priority takes the
    surplus every `trace` seconds for half of it, and a worker is killed once (the last
    listed, as the second preemption comes)."""
    c.create(digits_job(name, ns, EPOCHS), ns)

    def log() -> digits.Run:
        return digits.Run(c.pod_log(ns, f"{name}-launcher"))

    wait_for(lambda: log().epochs, 300, f"{name}'s first epoch", 1)
    i = 0
    while trace and c.phase(ns, name) not in ("Succeeded", "Failed"):
        if i == 1:
            c.kill(ns, c.hosts(ns, name)[-1])
        high = f"high{i}"
        c.create(prioritised(queued_job(high, replicas=1), ns, "high"), ns)
        time.sleep(trace / 2)
        c.kubectl("delete", "tj", high, "-n", ns, "--wait=false")
        time.sleep(trace / 2)
        i += 1
    wait_for(lambda: c.phase(ns, name) in ("Succeeded", "Failed"), 900, f"{name}'s end", 1)
    assert c.phase(ns, name) == "Succeeded", log().text[-2000:]
    return log()


def q3a(tmp: Path, every: float = 40.0) -> list[Row]:
    c = start_real(tmp, nodes=2, kueue=True)
    try:
        ns = c.new_namespace()
        prioritised_queue(c, ns)
        static = finished(c, ns, "static")
        traced = finished(c, ns, "traced", every)
    finally:
        c.stop()
    (s_rate, _), (t_rate, share) = given(static), given(traced)
    s_acc, t_acc = static.accuracy or 0.0, traced.accuracy or 0.0
    return [
        ("Q3a", f"digits, {EPOCHS} epochs at 4 (min 2): test accuracy undisturbed", f"{s_acc}",
         ""),
        ("Q3a", f"... under preemptions every {every:.0f}s and a killed worker",
         f"{t_acc} ({(t_acc - s_acc) * 100:+.1f} points)", "within 1 point"),
        ("Q3a", "epochs a second: undisturbed / traced (mean size given)",
         f"{s_rate:.3f} / {t_rate:.3f} ({4 * share:.2f} of 4)", ""),
        ("Q3a", "... traced against the size it was given (two cores: smaller is faster here)",
         f"{100 * t_rate / (s_rate * share):.1f}%", ""),
    ]  # fmt: skip
