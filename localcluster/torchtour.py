"""The tour of a Torchrun job (`make demo ARGS=--runtime=Torchrun`): examples/torchrun/ as a
user runs it (the digits under torchrun: ScaleOut +2, ScaleIn by name, `kubectl scale`, a
killed worker, to Succeeded), each resize timed from its request to rank 0's first step at
the new size, read from the workers' logs all along (torchlogs.Logbook)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from localcluster import digits
from localcluster.torchlogs import Logbook
from localcluster.tour import (
    ROOT,
    TRANSITION_TIMEOUT,
    check,
    scalers_succeeded,
    wait_for,
    wait_scaled,
)  # fmt: skip

JOB = "torchrun-training"
EXAMPLES = ROOT / "examples" / "torchrun"


def example(extra: list[str]) -> dict[str, Any]:
    """The example job, `extra` arguments added to its script's."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "training_job.yaml").read_text())
    doc["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["command"] += extra
    return doc


def example_arg(name: str, extra: tuple[str, ...] = ()) -> int:
    """A number the example job passes its script (`--name=N`; the last given, as argparse
    takes it), with `extra` arguments added."""
    c = example(list(extra))["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"]
    given = [a.split("=", 1)[1] for a in c[0]["command"] if a.startswith(f"--{name}=")]
    return int(given[-1])


@dataclass
class TorchrunTour:
    kubectl: Callable[..., subprocess.CompletedProcess[str]]  # already bound to the namespace
    book: Logbook
    kill_worker: Callable[[str], object]
    status: Callable[[str, str], dict[str, Any]]  # an object's status, by kind and name
    slow: float = 1.0  # timeout multiplier
    extra: tuple[str, ...] = ()  # arguments added to the example script's (run's)
    say: Callable[[str], None] = print

    def phase(self, kind: str = "TrainingJob", name: str = JOB) -> str:
        return str(self.status(kind, name).get("phase") or "")

    def scale(self, example: str) -> None:
        """Create the example scaler and wait for its success."""
        self.kubectl("create", "-f", str(EXAMPLES / example))
        wait_scaled(self.phase, EXAMPLES / example, 120 * self.slow)

    def transition(self, what: str, size: int, act: Callable[[], object]) -> float:
        """Run `act`; the time to rank 0's first step at `size`, which goes on from the last
        checkpoint before it (at most --save-every steps back, never from the start)."""
        t0 = time.time()
        act()
        t = wait_for(
            lambda: self.book.first_at(size, t0),
            TRANSITION_TIMEOUT * self.slow, f"training at size {size} after {what}", interval=0.2,
        )  # fmt: skip
        assert t is not None
        seen = self.book.read()
        first = next(x for x in seen.steps if x[3] == t)
        last = max((x for x in seen.steps if x[3] < t), key=lambda x: x[3])  # the old size's
        back = last[0] - (first[0] - 1)
        saves = example_arg("save-every", self.extra)
        check(0 <= back <= saves, f"{what}: step {last[0]}, then {first}")
        self.say(
            f"{what}: first step at size {size} after {t - t0:.2f}s (step {first[0]}: "
            f"{back} step(s) taken again from the checkpoint)"
        )
        return t - t0

    def run(self, to_the_end: bool = True, extra: tuple[str, ...] = ()) -> dict[str, float]:
        """The tour; `to_the_end`: then wait for the job to succeed (a minute or two more);
        `extra`: arguments added to the example script's."""
        self.extra = extra
        self.kubectl("create", "-f", "-", input=yaml.safe_dump(example(list(extra))))
        self.book.wait_at(2, 0, 240 * self.slow)
        self.say(
            "training on 2 workers (each runs torchrun's agent; the launcher holds the rendezvous)"
        )
        timings = {
            "scale_out_+2": self.transition("ScaleOut +2", 4, lambda: self.scale("scale_out.yaml")),
            "scale_in_by_name": self.transition(
                "ScaleIn worker-1", 3, lambda: self.scale("scale_in.yaml")
            ),
            "kubectl_scale_2": self.transition(
                "kubectl scale --replicas 2", 2,
                lambda: self.kubectl("scale", "trainingjob", JOB, "--replicas", "2"),
            ),
        }  # fmt: skip
        planned = self.book.read()
        check({r for _, r in planned.starts} == {0}, f"planned changes used restarts: {planned}")
        survivor = self.workers()[-1]
        timings["worker_killed"] = self.transition(
            f"{survivor} killed", 1, lambda: self.kill_worker(survivor)
        )
        if to_the_end:
            self.finish()
        self.say(
            "transition timings (s): " + json.dumps({k: round(v, 2) for k, v in timings.items()})
        )
        return timings

    def workers(self) -> list[str]:
        return list(self.status("TrainingJob", JOB).get("currentWorkers") or [])

    def finish(self) -> digits.Run:
        """The job succeeds with every epoch trained; the kill was torchrun's one failure."""
        wait_for(lambda: self.phase() in ("Succeeded", "Failed"), 600 * self.slow, "the job's end")
        seen = self.book.read()
        ran = digits.Run(self.book.epochs())
        epochs = example_arg("epochs", self.extra)
        check(self.phase() == "Succeeded", f"job phase {self.phase()}")
        check({e.n for e in ran.epochs} == set(range(epochs)), f"an epoch missing: {ran.text}")
        check(ran.accuracy is not None, f"no DONE line: {ran.text[-500:]}")
        check(max(r for _, r in seen.starts) == 1, f"the kill is one restart: {seen.starts}")
        scalers_succeeded(self.kubectl)
        self.say(
            f"job Succeeded: {epochs} epochs, test accuracy {ran.accuracy}, each resize resumed "
            "from a checkpoint"
        )
        return ran
