"""P4, kills, P6, A1: training through resizes and failures (real nodes, real horovodrun)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import Row, pct
from localcluster import digits, procs
from localcluster.tour import EXAMPLE as TOUR_EXAMPLE
from localcluster.tour import JOB as TOUR_JOB
from localcluster.tour import Training
from localcluster.world import (
    ROOT,
    Chain,
    start_chain,
    wait_for,
)


def p4(tmp: Path) -> list[Row]:
    """The tour of `make demo` (full chain: real horovodrun), non-interactive, timed."""
    results = tmp / "tour.json"
    log = tmp / "demo.log"
    with open(log, "w") as out:
        code = subprocess.run(
            [
                sys.executable, "-m", "localcluster.demo", "--exit",
                "--dir", str(tmp / "demo"), "--api-port", str(procs.free_port()),
                "--results", str(results),
            ],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        ).returncode  # fmt: skip
    if code != 0:
        raise AssertionError("the demo's tour failed: " + log.read_text()[-1500:])
    t = json.loads(results.read_text())
    rows: list[Row] = [
        ("P4", "worker killed -> first step at the new size", f"{t['worker_killed']:.2f}s", ""),
        (
            "P4",
            "ScaleOut +2 -> first step at 4 workers",
            f"{t['scale_out_+2']:.2f}s",
            "(process start + imports)",
        ),
        ("P4", "ScaleIn (count) -> first step at 3", f"{t['scale_in_count_1']:.2f}s", ""),
        ("P4", "ScaleIn (name) -> first step at 2", f"{t['scale_in_by_name']:.2f}s", ""),
        ("P4", "kubectl scale 2 -> 3: first step at 3", f"{t['kubectl_scale_3']:.2f}s", ""),
    ]
    return rows


def kills(tmp: Path, rounds: int = 2) -> list[Row]:
    """A worker SIGKILLed on real containers at each position of a 4-worker ring, `rounds`
    times: killed -> first training step at 3 workers; `kubectl scale` back to 4 before the
    next. Where the dead rank sat decides who notices: its ring neighbour at once, the others
    only when an operation that waits on it fails."""
    c = start_chain(tmp / "chain")
    took: list[tuple[int, float]] = []  # (host-list position, seconds)
    try:
        ns = c.new_namespace()
        c.create(long_example(replicas=4), ns)
        tr = Training(lambda: c.pod_log(ns, f"{TOUR_JOB}-launcher"))
        wait_for(lambda: tr.first_step_at(4, 0), 300, "training at 4 workers", 0.5)
        for i in range(4 * rounds):
            took.append((i % 4, kill_at(c, ns, tr, i % 4)))
    finally:
        c.stop()
    v = [t for _, t in took]
    by_pos = ", ".join(f"#{p} {t:.1f}" for p, t in took)
    return [
        ("P4", f"worker killed (4 -> 3) -> first step at 3: {len(v)} kills, {rounds} a position",
         f"p50 {pct(v, 0.5):.2f}s, p95 {pct(v, 0.95):.2f}s, max {max(v):.2f}s", "<= 10 s at p95"),
        ("P4", "... each kill (host-list position: seconds)", by_pos, ""),
    ]  # fmt: skip


def long_example(replicas: int) -> dict[str, Any]:
    """examples/training_job.yaml at `replicas` workers, with steps enough to outlast a stage."""
    body: dict[str, Any] = yaml.safe_load(TOUR_EXAMPLE.read_text())
    cmd = body["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]
    args: list[str] = cmd["command"]
    args[args.index("-np") + 1] = str(replicas)
    args[args.index("--steps") + 1] = "1000000"
    body["spec"]["etReplicaSpecs"]["worker"]["replicas"] = replicas
    return body


def kill_at(c: Chain, ns: str, tr: Training, position: int) -> float:
    """Kill the worker at `position` of the host list; the seconds to the first step at 3.
    Then back to 4 workers, training at 4."""
    hosts = c.hosts(ns, TOUR_JOB)
    assert len(hosts) == 4, hosts
    t0 = time.time()
    c.kill(ns, hosts[position])
    t = wait_for(lambda: tr.first_step_at(3, t0), 120, f"size 3 after killing #{position}", 0.1)
    wait_for(lambda: len(c.hosts(ns, TOUR_JOB)) == 3, 60, "the killed worker unlisted", 0.2)
    c.kubectl("scale", "trainingjob", TOUR_JOB, "--replicas", "4", "-n", ns)
    t1 = time.time()
    wait_for(lambda: tr.first_step_at(4, t1), 180, "training at 4 workers again", 0.5)
    assert t is not None
    return t - t0


def p6(tmp: Path, epochs: int = 30, rounds: int = 3) -> list[Row]:
    """Training speed of the digits example (a CNN on a real data set, no sleeps:
    compute-bound) at 2 workers, four ways taken in turn `rounds` times (the median of each):
    plain `horovodrun -H` and plain elastic `horovodrun` (a fixed host list) on this machine,
    then in the job's own containers plain elastic `horovodrun` with a fixed host list (the
    same launch: only the operator's discovery differs) and the TrainingJob as shipped."""
    speeds: dict[str, list[float]] = {"static": [], "elastic": [], "fixed": [], "operator": []}
    c = start_chain(tmp / "chain")
    try:
        for _ in range(rounds):
            speeds["static"].append(digits.static(epochs).samples_per_s())
            speeds["elastic"].append(digits.static(epochs, elastic=True).samples_per_s())
            for way in ("fixed", "operator"):
                job = digits.Elastic.on(c, c.new_namespace())
                job.create(epochs, None, fixed=way == "fixed")
                speeds[way].append(job.finish().samples_per_s())
    finally:
        c.stop()
    med = {k: statistics.median(v) for k, v in speeds.items()}

    def runs(k: str) -> str:
        return f"{med[k]:.0f} samples/s (runs: {', '.join(f'{v:.0f}' for v in speeds[k])})"

    def ratio(k: str) -> str:
        return f"{med['operator'] / med[k]:.3f}"

    return [
        ("P6", "digits CNN, 2 workers, on this machine: plain horovodrun -H localhost:2",
         runs("static"), ""),
        ("P6", "... plain horovodrun, elastic launch, fixed host list", runs("elastic"), ""),
        ("P6", "... in the job's containers: the same elastic launch, fixed host list",
         runs("fixed"), ""),
        ("P6", "... in the job's containers: the TrainingJob under the operator",
         runs("operator"), ""),
        ("P6", "operator / the same launch in the same containers", ratio("fixed"), ">= 0.97"),
        ("P6", "operator / plain elastic horovodrun on this machine", ratio("elastic"), ""),
        ("P6", "operator / plain horovodrun -H on this machine", ratio("static"), ""),
    ]  # fmt: skip


def accuracy(tmp: Path, epochs: int = digits.EPOCHS) -> list[Row]:
    """The full chain's elastic tour of the digits job against plain horovodrun, same epochs."""
    plain = digits.static(epochs, ranks=2)
    c = start_chain(tmp / "chain")
    try:
        job = digits.Elastic.on(c, c.new_namespace())
        job.create(epochs, None)
        job.tour()
        resized = job.run()
    finally:
        c.stop()
    diff = (resized.accuracy or 0) - (plain.accuracy or 0)
    return [
        ("A1", f"test accuracy after {epochs} epochs: static (plain horovodrun, 2 ranks)",
         f"{plain.accuracy}", ""),
        ("A1", "... elastic (ScaleOut +2, ScaleIn by count and by name, a worker killed, "
         "suspended and resumed)",
         f"{resized.accuracy} ({diff * 100:+.1f} points)", "within 1 point"),
    ]  # fmt: skip
