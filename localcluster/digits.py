"""The digits example (examples/digits_train.py) run two ways on this machine, for the full
chain and for `make bench`: statically under plain `horovodrun`, and elastically as the
TrainingJob of examples/training_job_digits.yaml through the scaler examples (ScaleOut +2,
ScaleIn by count, ScaleIn by name) and a killed worker."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from localcluster import procs, runnotes
from localcluster.nodes import CACHE
from localcluster.tour import TRANSITION_TIMEOUT, scene
from localcluster.world import ROOT, Chain, Timeout, wait_for

TRAIN_SAMPLES = 1437  # 80 % of the 1,797 digits
MAX_RANKS = 4  # the example job's maxReplicas, one slot each
# The tour's four resizes are done by the 5th epoch (alone, and beside the suite: its remark);
# then a suspension, whose stop and save take a few epochs' time at 1 worker.
EPOCHS = 30
EXAMPLE = "training_job_digits.yaml"
JOB = "elastic-training"  # the example's name (the scaler examples select it)
EPOCH = re.compile(r"EPOCH (\d+) size=(\d+) test_accuracy=([\d.]+) t=([\d.]+)")
DONE = re.compile(r"DONE epochs=(\d+) size=(\d+) test_accuracy=([\d.]+) resets=(\d+)")
RESUMED = re.compile(r"RESUMED step=(\d+) epoch=(\d+) position=(\d+)")


class Epoch(NamedTuple):
    n: int
    size: int
    accuracy: float
    t: float


@dataclass(frozen=True)
class Run:
    """What rank 0 printed."""

    text: str

    @property
    def epochs(self) -> list[Epoch]:
        return [
            Epoch(int(a), int(b), float(c), float(d)) for a, b, c, d in EPOCH.findall(self.text)
        ]

    @property
    def accuracy(self) -> float | None:
        m = DONE.search(self.text)
        return float(m[3]) if m else None

    def first_epoch_at(self, size: int, after: float) -> float | None:
        return next((e.t for e in self.epochs if e.size == size and e.t >= after), None)

    def samples_per_s(self) -> float:
        """Training speed between the first and the last epoch's end (start-up left out)."""
        e = self.epochs
        if len(e) < 3:
            return float("nan")
        return (len(e) - 1) * TRAIN_SAMPLES / (e[-1].t - e[0].t)


def static(epochs: int, ranks: int = 2, samples: Path | None = None, elastic: bool = False) -> Run:
    """Plain `horovodrun` on this machine, no operator and no resizes: `-H localhost:<ranks>`,
    or with `elastic` the job's own launch shape (`--host-discovery-script`), with a script
    that always prints `localhost:<ranks>`."""
    venv = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as d:
        if elastic:
            script = Path(d) / "discover_hosts.sh"
            script.write_text(f"#!/bin/sh\necho localhost:{ranks}\n")
            script.chmod(0o755)
            hosts = ["--min-np", "1", "--max-np", str(MAX_RANKS), "--host-discovery-script",
                     str(script), "--network-interface", "lo"]  # fmt: skip
        else:
            hosts = ["-H", f"localhost:{ranks}"]
        cmd = [
            str(venv / "horovodrun"), "-np", str(ranks), *hosts,
            sys.executable, str(ROOT / "examples/digits_train.py"), "--epochs", str(epochs),
        ]  # fmt: skip
        if samples is not None:
            cmd += ["--log-samples", str(samples)]
        return alone(cmd, ranks)


def static_torchrun(epochs: int, ranks: int = 1) -> Run:
    """The Torchrun script (examples/torchrun/digits.py) under plain `torchrun --standalone`
    on this machine: no operator, no resizes, its checkpoints in a directory of its own."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [
            str(Path(sys.executable).parent / "torchrun"), "--standalone",
            f"--nproc-per-node={ranks}", str(ROOT / "examples/torchrun/digits.py"),
            "--epochs", str(epochs), "--checkpoints", d,
        ]  # fmt: skip
        return alone(cmd, ranks)


def alone(cmd: list[str], ranks: int) -> Run:
    """`cmd` run to its end, its ranks weighing as the processes they are (as a job's pods do
    on their nodes)."""
    venv = Path(sys.executable).parent
    # Its own temporary directory, gone with it: torchrun's log directory and torch's compile
    # cache stayed in the machine's /tmp otherwise.
    with tempfile.TemporaryDirectory() as tmp, procs.cpus_of_their_own("static-run", ranks) as join:
        env = {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=join,
                             env={**env, "TMPDIR": tmp})  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return Run(out.stdout)


def kept(run: Callable[[], Run], *key: object, samples: Path | None = None) -> Run:
    """A static reference run's outcome (rank 0's lines, and the sample log `run` writes to
    `samples`), run once per `key`, the examples' code and the torch and Horovod installed,
    then kept in the set-up's cache: the suite compares every elastic run with one, and
    training it again each time was a third of the machine's CPU while it ran. Not for the
    benchmarks, which time the run itself."""
    h = hashlib.sha256(repr((key, metadata.version("torch"), metadata.version("horovod"))).encode())
    for f in sorted((ROOT / "examples").rglob("*.py")):
        h.update(f.read_bytes())
    done = CACHE / "references" / h.hexdigest()[:16]
    if (done / "stdout").exists():
        if samples is not None:
            shutil.copytree(done / "samples", samples, dirs_exist_ok=True)
        return Run((done / "stdout").read_text())
    out = run()
    tmp = done.with_name(f"{done.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if samples is not None:
        shutil.copytree(samples, tmp / "samples")
    (tmp / "stdout").write_text(out.text)  # last: what makes it whole
    try:
        tmp.rename(done)
    except OSError:  # another process kept it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def example(name: str) -> dict[str, Any]:
    """One of the scaler examples, as shipped (they select the example job by its name)."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


SAMPLES_MOUNT = "/samples"


FIXED_HOSTS = "/tmp/fixed_hosts.sh"


def manifest(epochs: int, samples: Path | None = None, fixed: bool = False) -> dict[str, Any]:
    """The example job with its epochs set and, for the tests, the sample log on: the workers
    (where the ranks run) write it to a hostPath volume, this machine's directory `samples`.
    With `fixed`, the launcher reads a script of its own that always lists the two workers
    instead of the operator's: the same launch in the same containers, without discovery."""
    doc = example(EXAMPLE)
    specs = doc["spec"]["etReplicaSpecs"]
    container = specs["launcher"]["template"]["spec"]["containers"][0]
    cmd = container["command"]
    cmd[cmd.index("--epochs") + 1] = str(epochs)
    if samples is not None:
        samples.mkdir(parents=True, exist_ok=True)
        cmd += ["--log-samples", SAMPLES_MOUNT]
        worker = specs["worker"]["template"]["spec"]
        worker.setdefault("volumes", []).append(
            {"name": "samples", "hostPath": {"path": str(samples), "type": "Directory"}}
        )
        worker["containers"][0].setdefault("volumeMounts", []).append(
            {"name": "samples", "mountPath": SAMPLES_MOUNT}
        )
    if fixed:
        cmd[cmd.index("--host-discovery-script") + 1] = FIXED_HOSTS
        hosts = "".join(f"echo {JOB}-worker-{i}:1\\n" for i in range(2))
        write = f"printf '#!/bin/sh\\n{hosts}' > {FIXED_HOSTS} && chmod +x {FIXED_HOSTS}"
        container["command"] = ["sh", "-c", f'{write} && exec "$@"', "sh", *cmd]
    return doc


@dataclass
class Elastic:
    """The example job on the local full-chain cluster, driven through its resizes."""

    c: Chain
    ns: str
    log: Callable[[], str]  # the launcher's output so far
    killed_at: float = 0.0

    @classmethod
    def on(cls, c: Chain, ns: str) -> Elastic:
        return cls(c, ns, lambda: c.pod_log(ns, f"{JOB}-launcher"))

    def run(self) -> Run:
        return Run(self.log())

    def create(self, epochs: int, samples: Path | None, fixed: bool = False) -> None:
        out = self.c.kubectl_create(self.ns, manifest(epochs, samples, fixed))
        assert out.returncode == 0, out.stderr
        wait_for(lambda: self.run().first_epoch_at(2, 0), 180, "an epoch on 2 workers", 0.2)

    def step(self, what: str, size: int, act: Callable[[], object]) -> float:
        """`act`, then the first epoch that ends at `size`: the seconds between."""
        t0 = time.time()
        act()
        try:
            t = wait_for(
                lambda: self.run().first_epoch_at(size, t0),
                TRANSITION_TIMEOUT,
                f"{what}: size {size}",
                0.2,
            )
        except Timeout as exc:
            get = lambda *a: str(self.c.kubectl("-n", self.ns, *a, check=False).stdout)  # noqa: E731
            raise Timeout(f"{exc}\n{scene(get, self.log())}") from None
        assert t is not None
        return t - t0

    def scale(self, what: str, size: int, body: dict[str, Any]) -> float:
        """Create a scaler; time it to the new size, then wait for it to succeed."""
        took = self.step(
            what, size, lambda: self.c.kubectl_create(self.ns, body).check_returncode()
        )
        kind, name = body["kind"], body["metadata"]["name"]
        wait_for(
            lambda: self.c.phase(self.ns, name, kind) == "ScaleSucceeded", 60, f"{what} done", 0.2
        )
        return took

    def finish(self) -> Run:
        wait_for(lambda: self.c.phase(self.ns, JOB) == "Succeeded", 600, "the job to succeed", 1)
        return self.run()

    def kill(self, pod: str) -> None:
        self.killed_at = time.time()
        self.c.kill(self.ns, pod)

    def tour(self) -> dict[str, float]:
        """ScaleOut +2, ScaleIn by count, ScaleIn by name, a killed worker, a suspension and
        its resume: each timed to the first epoch at the new size; then the job must
        succeed."""
        w = f"{JOB}-worker"
        timings = {
            "scale_out_+2": self.scale("ScaleOut +2", 4, example("scale_out.yaml")),
            "scale_in_count_1": self.scale("ScaleIn 1", 3, example("scale_in_count.yaml")),
            "scale_in_by_name": self.scale("ScaleIn worker-1", 2, example("scale_in_pod.yaml")),
        }
        hosts = self.c.hosts(self.ns, JOB)
        assert hosts == [f"{w}-0", f"{w}-2"], hosts
        timings["worker_killed"] = self.step("worker-2 killed", 1, lambda: self.kill(f"{w}-2"))
        # Horovod may shrink before the kubelet reports the dead container (its relist).
        wait_for(lambda: self.c.hosts(self.ns, JOB) == [f"{w}-0"], 10, "worker-2 out of the list")
        timings["suspended_resumed"] = self.suspended(1)
        # Where the tour ended, against the epochs it has: how many are needed under load.
        last = self.run().epochs[-1].n
        runnotes.remark(f"digits: the tour's changes done by epoch {last} of {EPOCHS}")
        self.finish()
        return timings

    def suspend(self, suspend: bool) -> None:
        body = json.dumps({"spec": {"suspend": suspend}})
        self.c.kubectl("-n", self.ns, "patch", "trainingjob", JOB, "--type=merge", "-p", body)

    def suspended(self, size: int) -> float:
        """The job suspended mid-epoch, then resumed at `size`: its launcher asks the
        training to save as the run stops, and the new run goes on from the step saved (the
        job's status names it). The seconds from the resume to the new run's first epoch."""
        self.suspend(True)
        wait_for(lambda: not self.c.pods(self.ns, JOB, live=False), 90, "every pod gone", 0.5)
        took = self.step("resumed", size, lambda: self.suspend(False))
        resumed = RESUMED.search(self.log())
        saved = self.c.status(self.ns, JOB).get("lastSaved") or {}
        assert resumed is not None and int(resumed[1]) == saved.get("step"), (resumed, saved)
        return took
