"""The elastic-training tour, written once: `make demo` shows it, the full-chain tier
(tests/fullchain) and the real-cluster tier (tests/cluster) assert it. Same manifests, same
waits: create the example job, then ScaleOut +2, ScaleIn by count, ScaleIn by pod name,
`kubectl scale`, and a killed worker, each timed from the request to the first training step at
the new size; then the job must succeed with every step done."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml

from etoperator import naming
from localcluster import runnotes
from localcluster.cluster import OPERATOR_LABEL, OPERATOR_NS

ROOT = Path(__file__).resolve().parents[1]
JOB = "elastic-training"
EXAMPLE = ROOT / "examples" / "training_job.yaml"
T = TypeVar("T")


class TourFailed(AssertionError):
    """A step of the tour did not reach what it should have (the message says which)."""


def wait_for(
    fn: Callable[[], T], timeout: float = 20.0, what: str = "condition", interval: float = 0.05
) -> T:
    """Poll `fn` until it returns something truthy; fail with its last value at the deadline."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        value = fn()
        if value:
            runnotes.slow_wait(what, time.monotonic() - start, timeout)
            return value
        if time.monotonic() > deadline:
            raise TourFailed(f"timed out after {timeout:.0f}s waiting for {what}; last: {value!r}")
        time.sleep(interval)


def example_steps() -> int:
    """The number of steps examples/training_job.yaml asks for."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    cmd = manifest["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]
    return int(cmd["command"][cmd["command"].index("--steps") + 1])


STEP = re.compile(r"STEP (\d+) size=(\d+) loss=([\d.]+) t=([\d.]+)")
DONE = re.compile(r"DONE steps=(\d+) size=(\d+) eval_before=([\d.]+) eval_after=([\d.]+)")
RESUMED = re.compile(r"RESUMED step=(\d+)")


@dataclass
class Training:
    """What the example script printed, read from the launcher's log."""

    read_log: Callable[[], str]
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)
    done: tuple[int, int, float, float] | None = None
    resumed: int | None = None  # the step a fresh run resumed from (the last RESUMED line)

    def read(self) -> Training:
        text = self.read_log()
        self.steps = [(int(a), int(b), float(c), float(d)) for a, b, c, d in STEP.findall(text)]
        m = DONE.search(text)
        self.done = (int(m[1]), int(m[2]), float(m[3]), float(m[4])) if m else None
        self.resumed = next((int(r) for r in reversed(RESUMED.findall(text))), None)
        return self

    def first_step_at(self, size: int, after: float) -> float | None:
        for _, s, _, t in self.read().steps:
            if s == size and t >= after:
                return t
        return None


# How long a transition may take to reach its first training step at the new size: alone,
# 1-25 s; on a loaded two-core machine a ScaleOut's new worker took 50-85 s just to start its
# process and join Horovod's rendezvous (the suite beside it). A bound to tell a stuck tour,
# not a speed goal (the tour prints each transition's time; bench/ holds the goals).
TRANSITION_TIMEOUT = 180

# A Python traceback's frames and carets: what horovodrun raised is on the lines around them.
FRAME = re.compile(r'^(\[\d+\]<std\w+>:)?\s+(File "|\^+$|\S.*\)$)')


def own_lines(log: str, last: int = 30) -> list[str]:
    """A launcher's last lines of its own (horovodrun's: its resets, rendezvous and exits),
    the training steps and traceback frames left out."""
    lines = log.splitlines()
    return [line for line in lines if not STEP.search(line) and not FRAME.search(line)][-last:]


def scene(kubectl: Callable[..., str], log: str) -> str:
    """What a failed step leaves to read: the objects, the namespace's last events, the
    operator's last words, and the launcher's own lines (horovodrun's, not the steps)."""
    own = own_lines(log)
    steps = [line for line in log.splitlines() if STEP.search(line)][-3:]
    events = kubectl("get", "events", "--sort-by=.lastTimestamp").splitlines()[-25:]
    operator = kubectl(
        "logs", "-n", OPERATOR_NS, "-l", OPERATOR_LABEL,
        "--tail=30", "--prefix", "--all-containers",
    )  # fmt: skip
    return "\n".join([
        "--- objects", kubectl("get", "tj,so,si,pods", "-o", "wide"),
        "--- events", *events, "--- operator", operator,
        "--- launcher (its own lines, then the last steps)", *own, *steps,
    ])  # fmt: skip


def check(ok: object, message: str) -> None:
    if not ok:
        raise TourFailed(message)


@dataclass
class Tour:
    kubectl: Callable[..., subprocess.CompletedProcess[str]]  # already bound to the namespace
    launcher_log: Callable[[], str]
    kill_worker: Callable[[str], object]
    # An object's status by kind and name: what the tour polls, read as a client would (the
    # demo's own connection); what it shows a user is kubectl's.
    status: Callable[[str, str], dict[str, Any]]
    slow: float = 1.0  # timeout multiplier (real clusters pull images, schedule pods...)
    say: Callable[[str], None] = print
    show: bool = False  # after each step: kubectl get, the host list, the last training lines

    def transition(self, tr: Training, what: str, size: int, act: Callable[[], object]) -> float:
        """Run `act`, time it to the first training step at `size`, then wait for what `act`
        returned (a wait for its scaler to succeed) before the next step."""
        t0 = time.time()
        settled = act()
        try:
            t = wait_for(
                lambda: tr.first_step_at(size, t0),
                TRANSITION_TIMEOUT * self.slow,
                f"training at size {size} after {what}",
                interval=0.2,
            )
        except TourFailed as exc:
            get = lambda *a: str(self.kubectl(*a, check=False).stdout)  # noqa: E731
            raise TourFailed(f"{exc}\n{scene(get, self.launcher_log())}") from None
        assert t is not None
        step = max(n for n, *_ in tr.steps)
        self.say(f"{what}: first training step at size {size} after {t - t0:.2f}s (step {step})")
        if callable(settled):
            settled()
        self.report(tr)
        return t - t0

    def report(self, tr: Training) -> None:
        if not self.show:
            return
        self.say(self.kubectl("get", "tj,so,si", check=False).stdout.rstrip())
        self.say(f"host list: {' '.join(self.hosts())}")
        for step, size, loss, _ in tr.steps[-3:]:
            self.say(f"  step {step}  workers {size}  loss {loss:.4f}")
        self.say("")

    def create(self, example: str) -> None:
        self.kubectl("create", "-f", str(ROOT / "examples" / example))

    def hosts(self) -> list[str]:
        return list(self.status(naming.JOB_KIND, JOB).get("currentWorkers") or [])

    def phase(self, kind: str = naming.JOB_KIND, name: str = JOB) -> str:
        return str(self.status(kind, name).get("phase") or "")

    def scale(self, example: str) -> Callable[[], None]:
        """Create the example scaler; return a wait for it to report ScaleSucceeded."""
        self.create(example)
        return partial(wait_scaled, self.phase, ROOT / "examples" / example, 60 * self.slow)

    def start(self) -> Training:
        """Create the example job; return once it trains on its 2 workers."""
        self.create("training_job.yaml")
        tr = Training(self.launcher_log)
        wait_for(
            lambda: tr.first_step_at(2, 0), 180 * self.slow, "training on 2 workers", interval=0.5
        )
        check(self.phase() == "Running", f"job phase {self.phase()!r}, not Running")
        return tr

    def run(self, results: Path | None = None) -> dict[str, float]:
        steps = example_steps()
        tr = self.start()
        t_first = time.time()
        wait_for(lambda: len(tr.read().steps) >= 40, 60 * self.slow, "40 steps at 2 workers")
        self.report(tr)
        at2 = [t for _, size, _, t in tr.steps if size == 2 and t >= t_first]
        timings = {
            "steps_per_s_at_2": (len(at2) - 1) / (at2[-1] - at2[0]),
            "scale_out_+2": self.transition(
                tr, "ScaleOut +2", 4, lambda: self.scale("scale_out.yaml")
            ),
            "scale_in_count_1": self.transition(
                tr, "ScaleIn count 1", 3, lambda: self.scale("scale_in_count.yaml")
            ),
            "scale_in_by_name": self.transition(
                tr, "ScaleIn worker-1", 2, lambda: self.scale("scale_in_pod.yaml")
            ),
        }
        hosts = self.hosts()
        check(hosts == [f"{JOB}-worker-0", f"{JOB}-worker-2"], f"host list {hosts}")
        timings["kubectl_scale_3"] = self.transition(
            tr, "kubectl scale --replicas 3", 3,
            lambda: self.kubectl("scale", "trainingjob", JOB, "--replicas", "3"),
        )  # fmt: skip
        timings["worker_killed"] = self.transition(
            tr, "worker-2 killed", 2, lambda: self.kill_worker(f"{JOB}-worker-2")
        )
        survivors = [f"{JOB}-worker-0", f"{JOB}-worker-4"]
        wait_for(
            lambda: self.hosts() == survivors, 10 * self.slow, "the killed worker out of the list"
        )
        # Where the resizes ended, against the steps the job has: how many are needed.
        last = max(n for n, *_ in tr.read().steps)
        runnotes.remark(f"tour: its resizes done by step {last} of {steps}")
        self.finish(tr, steps)
        self.say(
            "transition timings (s): " + json.dumps({k: round(v, 2) for k, v in timings.items()})
        )
        if results is not None:
            results.write_text(json.dumps(timings, indent=2))
        return timings

    def finish(self, tr: Training, steps: int) -> None:
        """The job succeeds with every step done and the loss down; the scalers all succeeded."""
        wait_for(
            lambda: self.phase() == "Succeeded", 240 * self.slow, "the job to succeed", interval=0.5
        )
        done = tr.read().done
        check(done is not None, "no DONE line: " + self.launcher_log()[-3000:])
        assert done is not None
        n, size, before, after = done
        check(n == steps and size == 2, f"DONE steps={n} size={size}")
        check(after < before * 0.7, f"loss did not go down: {before} -> {after}")
        seen = {s for s, *_ in tr.steps}
        check(set(range(1, steps + 1)) <= seen, "a training step is missing from the log")
        # What the launcher printed also reaches a user through the apiserver and the kubelet.
        logs = self.kubectl("logs", f"{JOB}-launcher").stdout
        check(f"DONE steps={steps}" in logs, logs[-2000:])
        scalers_succeeded(self.kubectl)
        self.say(f"job Succeeded: {n} steps, eval loss {before:.4f} -> {after:.4f}")


def wait_scaled(phase: Callable[[str, str], str], example: Path, timeout: float) -> None:
    """Wait for the scaler of the `example` manifest to report ScaleSucceeded."""
    doc = yaml.safe_load(example.read_text())
    kind, name = doc["kind"], doc["metadata"]["name"]
    wait_for(
        lambda: phase(kind, name) == "ScaleSucceeded", timeout, f"{kind} {name} to succeed", 0.2
    )


def scalers_succeeded(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """Every ScaleOut and ScaleIn there is, as `kubectl get` shows them, ScaleSucceeded."""
    for kind in ("scaleout", "scalein"):
        out = kubectl("get", kind).stdout
        rows = [line.split() for line in out.splitlines()[1:]]
        check(rows and all(r[1] == "ScaleSucceeded" for r in rows), out)


QUEUES = ROOT / "examples" / "kueue"
TJ, SO = naming.JOB_KIND, naming.SCALEOUT_KIND


@dataclass
class QueueTour:
    """Shared clusters, shown: two queued jobs where Kueue's quota holds one (the second waits,
    saying why, and runs once the first is deleted), and a ScaleOut that waits for quota and is
    rolled back at its timeout."""

    kubectl: Callable[..., subprocess.CompletedProcess[str]]
    status: Callable[[str, str], dict[str, Any]]  # as Tour's
    say: Callable[[str], None] = print

    def conditions(self, kind: str, name: str) -> dict[str, str]:
        """Each condition's message by its type."""
        conds = self.conditions_of(kind, name)
        return {str(c.get("type")): str(c.get("message") or "") for c in conds}

    def said(self, kind: str, name: str, ctype: str) -> str:
        return self.conditions(kind, name).get(ctype, "")

    def conditions_of(self, kind: str, name: str) -> list[dict[str, Any]]:
        return list(self.status(kind, name).get("conditions") or [])

    def reach(self, kind: str, name: str, phase: str, timeout: float) -> None:
        wait_for(lambda: self.status(kind, name).get("phase") == phase, timeout,
                 f"{kind} {name} {phase}", interval=0.2)  # fmt: skip

    def run(self) -> dict[str, float]:
        self.kubectl("apply", "-f", str(QUEUES / "queues.yaml"))
        job = yaml.safe_load((QUEUES / "queued_job.yaml").read_text())
        command = job["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]
        steps = command["command"].index("--steps") + 1
        command["command"][steps] = "5000"  # queued-a trains until the tour deletes it
        self.kubectl("create", "-f", "-", input=yaml.safe_dump(job))
        job["metadata"]["name"], command["command"][steps] = "queued-b", "60"
        self.kubectl("create", "-f", "-", input=yaml.safe_dump(job))
        self.reach(TJ, "queued-a", "Running", 180)
        # Kueue's words, once it has looked at queued-b (over 30 s once, in the suite's CI).
        wait_for(lambda: "quota" in self.said(TJ, "queued-b", "Queued"), 60, "queued-b waiting")
        self.say(self.kubectl("get", "tj").stdout.rstrip())
        self.say(f"queued-b waits: {self.said(TJ, 'queued-b', 'Queued')}")
        self.kubectl("create", "-f", str(QUEUES / "scale_out.yaml"))
        more = "queued-a-more"
        wait_for(lambda: "WaitingForQuota" in json.dumps(self.conditions_of(SO, more)), 30,
                 "the ScaleOut waiting for quota")  # fmt: skip
        self.say(f"ScaleOut {more}: {self.said(SO, more, 'Scaling')}")
        self.reach(SO, more, "ScaleFailed", 60)  # its timeout
        failed = self.said(SO, more, "ScaleFailed")
        check("not admitted within" in failed, f"ScaleOut {more} failed otherwise: {failed}")
        self.say(f"ScaleOut {more} rolled back: {failed}")
        # Its quota goes back as it goes: the job waiting for it is admitted.
        t0 = time.time()
        self.kubectl("delete", "tj", "queued-a", "--wait=false")
        self.reach(TJ, "queued-b", "Running", 180)
        waited = time.time() - t0
        self.say(f"queued-a deleted; queued-b admitted and running {waited:.2f}s later")
        self.reach(TJ, "queued-b", "Succeeded", 240)
        self.say(self.kubectl("get", "tj").stdout.rstrip())
        return {"queued_job_running_after_first_ends": waited}
