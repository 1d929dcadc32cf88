"""Torchrun jobs on the real nodes: real torchrun agents, the rendezvous the launcher holds,
checkpoints on a volume every worker reaches; scaled by the same ScaleOut and ScaleIn, a
worker killed. After each change the job trains on at the new size from where it was, and a
planned change uses up none of the agents' --max-restarts."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcluster.manifests import scalein, scaleout, torchrun_job
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.integration
SAVE_EVERY = 5
SAMPLE = 0.3  # seconds between reads of the workers' logs
START = re.compile(r"START size=(\d+) restarts=(\d+)")
STEP = re.compile(r"STEP (\d+) size=(\d+) loss=[\d.]+ first=(\d+) t=([\d.]+)")


@dataclass
class Seen:
    """What rank 0 printed, read from every live worker's log (rank 0 is one of them)."""

    starts: list[tuple[int, int]]  # (size, restarts) at each start of the training processes
    steps: list[tuple[int, int, int, float]]  # (step, size, first sample, time)

    def last(self) -> tuple[int, int, int, float] | None:
        return max(self.steps, key=lambda s: s[3]) if self.steps else None


class Logbook:
    """Every line rank 0 printed, kept across reads: a worker's log goes with its pod (rank 0
    may be the one a ScaleIn takes), so the logs are read every SAMPLE seconds all along the
    test (in a thread), each read adding what the live workers say then."""

    def __init__(self, cluster: Cluster, ns: str, job: str) -> None:
        self.cluster, self.ns, self.job = cluster, ns, job
        self.starts: set[tuple[str, int, int, int]] = set()
        self.steps: set[tuple[int, int, int, float]] = set()
        self.lock = threading.Lock()
        self.reads, self.failed = 0, ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(SAMPLE):
            try:
                self.read()
                self.reads += 1
            except Exception as exc:  # a pod gone between list and read: read again
                self.failed = repr(exc)

    def read(self) -> Seen:
        with self.lock:
            return self._read()

    def _read(self) -> Seen:
        # A deleted worker prints on while its preStop takes it out of the rendezvous.
        for pod in self.cluster.pods(self.ns, self.job, "worker", live=False):
            text = self.cluster.pod_log(self.ns, pod)
            found = START.findall(text)
            self.starts |= {(pod, i, int(a), int(b)) for i, (a, b) in enumerate(found)}
            self.steps |= {(int(a), int(b), int(c), float(d)) for a, b, c, d in STEP.findall(text)}
        starts = [(a, b) for _, _, a, b in sorted(self.starts)]
        return Seen(starts, sorted(self.steps, key=lambda x: x[3]))

    def trains_at(self, size: int, after: float) -> Seen | None:
        """Rank 0 has taken a few steps at `size` since `after`."""
        assert self.reads or not self.failed, f"the logs could not be read: {self.failed}"
        s = self.read()
        return s if len([x for x in s.steps if x[1] == size and x[3] > after]) >= 3 else None

    def wait_at(self, size: int, after: float, timeout: float) -> Seen:
        seen = wait_for(lambda: self.trains_at(size, after), timeout, f"training at {size}")
        assert seen is not None
        return seen


def continued(s: Seen, size: int, since: float) -> None:
    """The run at the new size went on from the last checkpoint before the change: its first
    step is at most SAVE_EVERY steps behind the last step taken before, never back at 0."""
    first = min((x for x in s.steps if x[1] == size and x[3] > since), key=lambda x: x[3])
    last = max((x for x in s.steps if x[3] < first[3]), key=lambda x: x[3])
    assert last[0] - SAVE_EVERY <= first[0] - 1 <= last[0], (last, first)


@pytest.fixture
def logs(cluster: Cluster, ns: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test shows what the job's pods said (rank 0's lines, torch's own)."""
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        for pod in cluster.pods(ns, "tr", live=False):
            print(f"--- {pod} ---\n{cluster.pod_log(ns, pod)[-4000:]}")


def test_a_torchrun_job_scales_out_and_in_and_outlives_a_killed_worker(
    cluster: Cluster, ns: str, logs: None, request: pytest.FixtureRequest
) -> None:
    args = ["--steps", "100000", "--step-sleep", "0.1", "--save-every", str(SAVE_EVERY)]
    cluster.create(torchrun_job("tr", 2, args, minReplicas=1, maxReplicas=4), ns)
    book = Logbook(cluster, ns, "tr")
    request.addfinalizer(book.done.set)
    book.wait_at(2, 0, 180)

    since = time.time()
    cluster.create(scaleout("out", "tr", 1, timeout=120), ns)
    wait_for(lambda: cluster.phase(ns, "out", "ScaleOut") == "ScaleSucceeded", 150, "ScaleOut")
    grown = book.wait_at(3, since, 60)
    continued(grown, 3, since)

    since = time.time()
    cluster.create(scalein("in", "tr", pod_names=["tr-worker-1"], timeout=60), ns)
    wait_for(lambda: cluster.phase(ns, "in", "ScaleIn") == "ScaleSucceeded", 90, "ScaleIn")
    shrunk = book.wait_at(2, since, 60)
    continued(shrunk, 2, since)
    assert {r for _, r in shrunk.starts} == {0}, f"planned changes used restarts: {shrunk}"
    assert cluster.pods(ns, "tr", "worker") == ["tr-worker-0", "tr-worker-2"]

    since = time.time()
    cluster.kill(ns, "tr-worker-2")
    alone = book.wait_at(1, since, 90)
    continued(alone, 1, since)
    assert max(r for _, r in alone.starts) == 1, f"a killed worker is one failure: {alone}"
    assert cluster.phase(ns, "tr") == "Running"


def test_a_torchrun_job_that_ends_succeeds_and_its_run_ends_with_it(
    cluster: Cluster, ns: str
) -> None:
    """The launcher's exit is the run's: every agent passed torch's exit barrier. The
    checkpoint is on the job's claim, a volume the local-path provisioner made."""
    cluster.create(torchrun_job("short", 2, ["--steps", "20"]), ns)
    wait_for(lambda: cluster.phase(ns, "short") in ("Succeeded", "Failed"), 180, "the end")
    assert cluster.phase(ns, "short") == "Succeeded", cluster.pod_log(ns, "short-launcher")
    assert "exit barrier passed" in cluster.pod_log(ns, "short-launcher")
    claim = cluster.obj("PersistentVolumeClaim", ns, "short-shared")
    assert claim["status"]["phase"] == "Bound"
    volume = cluster.api.get_cluster("PersistentVolume", claim["spec"]["volumeName"])
    assert volume is not None
    path = Path(volume["spec"]["hostPath"]["path"])
    assert (path / "checkpoint.pt").exists(), sorted(path.iterdir())
