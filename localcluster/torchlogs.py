"""What a Torchrun job's rank 0 prints (examples/torchrun/train.py), read from the workers'
logs all along a run: for tests and benchmarks alike."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from localcluster.node import LogsRead
from localcluster.world import World, wait_for

SAMPLE = 0.3  # seconds between reads of the workers' logs
TAIL = 4000  # characters of each worker's log kept for a failure's report
NOISE = ("frame #", "Exception raised from")  # torch's C++ stack traces
START = re.compile(r"START size=(\d+) restarts=(\d+)")
STEP = re.compile(r"STEP (\d+) size=(\d+) loss=[\d.]+ first=(\d+) t=([\d.]+)")
ENDS = re.compile(r"^(?:EPOCH|DONE) .*$", re.M)  # examples/torchrun/digits.py's


@dataclass
class Seen:
    """What rank 0 printed, read from every live worker's log (rank 0 is one of them)."""

    starts: list[tuple[int, int]]  # (size, restarts) at each start of the training processes
    steps: list[tuple[int, int, int, float]]  # (step, size, first sample, time)

    def last(self) -> tuple[int, int, int, float] | None:
        return max(self.steps, key=lambda s: s[3]) if self.steps else None


def _when(line: str) -> float:
    return float(line.rsplit("t=", 1)[1]) if " t=" in line else float("inf")  # DONE: last


class Logbook:
    """Every line rank 0 printed, kept across reads: a worker's log goes with its pod (rank 0
    may be the one a ScaleIn takes), so the logs are read every SAMPLE seconds all along the
    test (in a thread), each read adding what the live workers printed since the last."""

    def __init__(self, cluster: World, ns: str, job: str) -> None:
        self.cluster, self.ns, self.job = cluster, ns, job
        self.starts: set[tuple[str, int, int, int]] = set()
        self.steps: set[tuple[int, int, int, float]] = set()
        self.ends: set[str] = set()
        self.tails: dict[str, str] = {}  # each worker's last words, kept when its pod goes
        self.told: dict[str, list[str]] = {}  # each worker's telling lines (World.TELLING)
        self.logs: dict[str, LogsRead] = {}  # how far each worker's log files were read
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
            self._add(pod, self.cluster.pod_log_since(self.ns, pod, self.logs.setdefault(pod, {})))
        starts = [(a, b) for _, _, a, b in sorted(self.starts)]
        return Seen(starts, sorted(self.steps, key=lambda x: x[3]))

    def _add(self, pod: str, text: str) -> None:
        lines = [x for x in text.splitlines() if not x.startswith(NOISE)]
        if lines:
            kept, new = self.tails.get(pod), "\n".join(lines)
            self.tails[pod] = (f"{kept}\n{new}" if kept else new)[-TAIL:]
        self.told.setdefault(pod, []).extend(x for x in lines if any(t in x for t in World.TELLING))
        known = sum(1 for p, *_ in self.starts if p == pod)
        found = START.findall(text)
        self.starts |= {(pod, known + i, int(a), int(b)) for i, (a, b) in enumerate(found)}
        self.steps |= {(int(a), int(b), int(c), float(d)) for a, b, c, d in STEP.findall(text)}
        self.ends |= set(ENDS.findall(text))

    def said(self) -> str:
        """Every worker's last lines as last read, the deleted ones' too: what a failed test
        shows (a worker that stalled a round may be gone by the time it fails)."""
        with self.lock:
            tails = "".join(f"--- {pod} ---\n{text}\n" for pod, text in sorted(self.tails.items()))
            told = "".join(f"  {pod}: {x}\n" for pod, xs in sorted(self.told.items()) for x in xs)
            return f"{tails}--- what the workers' agents and leaves said ---\n{told}"

    def epochs(self) -> str:
        """The digits script's EPOCH lines in their order, then its DONE line."""
        with self.lock:
            return "\n".join(sorted(self.ends, key=_when))

    def trains_at(self, size: int, after: float) -> Seen | None:
        """Rank 0 has taken a few steps at `size` since `after`."""
        assert self.reads or not self.failed, f"the logs could not be read: {self.failed}"
        s = self.read()
        return s if len([x for x in s.steps if x[1] == size and x[3] > after]) >= 3 else None

    def wait_at(self, size: int, after: float, timeout: float) -> Seen:
        seen = wait_for(lambda: self.trains_at(size, after), timeout, f"training at {size}")
        assert seen is not None
        return seen

    def first_at(self, size: int, after: float) -> float | None:
        """When rank 0 finished its first step at `size` since `after` (unix time)."""
        times = [x[3] for x in self.read().steps if x[1] == size and x[3] > after]
        return min(times) if times else None
