"""The elastic-training scenario, written once and run against the one-machine chain
(tests/fullchain) and against a real cluster (tests/cluster): same manifests, same waits."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import ROOT, wait_for

JOB = "elastic-training"
STEPS = 300  # examples/training_job.yaml
STEP = re.compile(r"STEP (\d+) size=(\d+) loss=([\d.]+) t=([\d.]+)")
DONE = re.compile(r"DONE steps=(\d+) size=(\d+) eval_before=([\d.]+) eval_after=([\d.]+)")


@dataclass
class Training:
    """What the example script printed, read from the launcher's log."""

    read_log: Callable[[], str]
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)
    done: tuple[int, int, float, float] | None = None

    def read(self) -> Training:
        text = self.read_log()
        self.steps = [(int(a), int(b), float(c), float(d)) for a, b, c, d in STEP.findall(text)]
        m = DONE.search(text)
        self.done = (int(m[1]), int(m[2]), float(m[3]), float(m[4])) if m else None
        return self

    def first_step_at(self, size: int, after: float) -> float | None:
        for _, s, _, t in self.read().steps:
            if s == size and t >= after:
                return t
        return None


@dataclass
class Scenario:
    kubectl: Callable[..., subprocess.CompletedProcess[str]]  # already bound to the namespace
    launcher_log: Callable[[], str]
    kill_worker: Callable[[str], object]
    hosts: Callable[[], list[str]]
    phase: Callable[[], str]
    slow: float = 1.0  # timeout multiplier (real clusters pull images, schedule pods...)

    def transition(self, tr: Training, what: str, size: int, act: Callable[[], object]) -> float:
        t0 = time.time()
        act()
        t = wait_for(
            lambda: tr.first_step_at(size, t0),
            90 * self.slow,
            f"training at size {size} after {what}",
            interval=0.2,
        )
        assert t is not None
        print(f"{what}: first training step at size {size} after {t - t0:.2f}s")
        return t - t0

    def create(self, example: str) -> None:
        self.kubectl("create", "--validate=false", "-f", str(ROOT / "examples" / example))

    def run(self, results: Path | None = None) -> dict[str, float]:
        self.create("training_job.yaml")
        tr = Training(self.launcher_log)
        wait_for(
            lambda: tr.first_step_at(2, 0), 120 * self.slow, "training on 2 workers", interval=0.5
        )
        assert self.phase() == "Running"
        t_first = time.time()
        wait_for(lambda: len(tr.read().steps) >= 40, 60 * self.slow, "40 steps at 2 workers")
        at2 = [t for _, size, _, t in tr.steps if size == 2 and t >= t_first]
        timings = {
            "steps_per_s_at_2": (len(at2) - 1) / (at2[-1] - at2[0]),
            "scale_out_+2": self.transition(
                tr, "ScaleOut +2", 4, lambda: self.create("scale_out.yaml")
            ),
            "scale_in_count_1": self.transition(
                tr, "ScaleIn count 1", 3, lambda: self.create("scale_in_count.yaml")
            ),
            "scale_in_by_name": self.transition(
                tr, "ScaleIn worker-1", 2, lambda: self.create("scale_in_pod.yaml")
            ),
        }
        assert self.hosts() == [f"{JOB}-worker-0", f"{JOB}-worker-2"], self.hosts()
        timings["worker_killed"] = self.transition(
            tr, "worker-2 killed", 1, lambda: self.kill_worker(f"{JOB}-worker-2")
        )
        wait_for(
            lambda: self.hosts() == [f"{JOB}-worker-0"],
            10 * self.slow,
            "the killed worker out of the host list",
        )
        wait_for(
            lambda: self.phase() == "Succeeded", 240 * self.slow, "the job to succeed", interval=0.5
        )
        done = tr.read().done
        assert done is not None, self.launcher_log()[-3000:]
        steps, size, before, after = done
        assert steps == STEPS and size == 1
        assert after < before * 0.7, f"loss did not go down: {before} -> {after}"
        seen = {s for s, *_ in tr.steps}
        assert set(range(1, STEPS + 1)) <= seen, "a training step is missing from the log"
        for kind in ("scaleout", "scalein"):
            out = self.kubectl("get", kind).stdout
            rows = [line.split() for line in out.splitlines()[1:]]
            assert rows and all(r[1] == "ScaleSucceeded" for r in rows), out
        print("transition timings (s):", json.dumps(timings))
        if results is not None:
            results.write_text(json.dumps(timings, indent=2))
        return timings
