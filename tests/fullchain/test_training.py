"""The whole chain on one machine: kubectl -> emulator -> operator -> real sshd workers and a
real `horovodrun` launcher running the example elastic training, scaled while it trains."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness import ROOT, Cluster, wait_for

pytestmark = pytest.mark.fullchain
JOB = "elastic-training"
STEP = re.compile(r"STEP (\d+) size=(\d+) loss=([\d.]+) t=([\d.]+)")
DONE = re.compile(r"DONE steps=(\d+) size=(\d+) eval_before=([\d.]+) eval_after=([\d.]+)")


@dataclass
class Training:
    log: Path
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)
    done: tuple[int, int, float, float] | None = None

    def read(self) -> Training:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        self.steps = [(int(a), int(b), float(c), float(d)) for a, b, c, d in STEP.findall(text)]
        m = DONE.search(text)
        self.done = (int(m[1]), int(m[2]), float(m[3]), float(m[4])) if m else None
        return self

    def first_step_at(self, size: int, after: float) -> float | None:
        for _, s, _, t in self.read().steps:
            if s == size and t >= after:
                return t
        return None


def transition(c: Cluster, tr: Training, what: str, size: int, act, timeout: float = 90) -> float:
    t0 = time.time()
    act()
    t = wait_for(
        lambda: tr.first_step_at(size, t0),
        timeout,
        f"training at size {size} after {what}",
        interval=0.2,
    )
    took = t - t0
    print(f"{what}: first training step at size {size} after {took:.2f}s")
    return took


def test_elastic_training_survives_scaling_and_worker_loss(chain: Cluster) -> None:
    c = chain
    ns = c.new_namespace()
    kubectl = lambda *a: c.kubectl("-n", ns, *a)
    kubectl("create", "--validate=false", "-f", str(ROOT / "examples/training_job.yaml"))
    wait_for(lambda: c.kubelet.logs.get((ns, f"{JOB}-launcher")), 60, "launcher started")
    tr = Training(c.kubelet.logs[(ns, f"{JOB}-launcher")])
    wait_for(lambda: tr.first_step_at(2, 0), 90, "training on 2 workers", interval=0.2)
    assert c.phase(ns, JOB) == "Running"
    timings: dict[str, float] = {}

    timings["scale_out_+2"] = transition(
        c,
        tr,
        "ScaleOut +2",
        4,
        lambda: kubectl("create", "--validate=false", "-f", str(ROOT / "examples/scale_out.yaml")),
    )
    timings["scale_in_count_1"] = transition(
        c,
        tr,
        "ScaleIn count 1",
        3,
        lambda: kubectl(
            "create", "--validate=false", "-f", str(ROOT / "examples/scale_in_count.yaml")
        ),
    )
    timings["scale_in_by_name"] = transition(
        c,
        tr,
        "ScaleIn worker-1",
        2,
        lambda: kubectl(
            "create", "--validate=false", "-f", str(ROOT / "examples/scale_in_pod.yaml")
        ),
    )
    survivors = c.hosts(ns, JOB)
    assert survivors == [f"{JOB}-worker-0", f"{JOB}-worker-2"], survivors
    timings["worker_killed"] = transition(
        c, tr, "worker-2 killed", 1, lambda: c.kubelet.crash(ns, f"{JOB}-worker-2")
    )
    wait_for(lambda: c.hosts(ns, JOB) == [f"{JOB}-worker-0"], 10, "worker-2 out of the list")

    wait_for(lambda: c.phase(ns, JOB) == "Succeeded", 240, "the job to succeed", interval=0.5)
    done = tr.read().done
    assert done is not None, tr.log.read_text()[-3000:]
    steps, size, before, after = done
    assert steps == 300 and size == 1
    assert after < before * 0.7, f"loss did not go down: {before} -> {after}"
    seen = [s for s, *_ in tr.steps]
    assert max(seen) == 300 and set(range(1, 301)) <= set(seen)
    for kind in ("scaleout", "scalein"):
        out = kubectl("get", kind).stdout
        rows = [line.split() for line in out.splitlines()[1:]]
        assert rows and all(r[1] == "ScaleSucceeded" for r in rows), out
    print("transition timings (s):", json.dumps(timings))
    out = os.environ.get("ETOPERATOR_FULLCHAIN_RESULTS")
    if out:
        Path(out).write_text(json.dumps(timings, indent=2))
