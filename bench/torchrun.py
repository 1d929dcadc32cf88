"""T1: a Torchrun job resized, request -> rank 0's first training step at the new size, under
etoperator and under torchrun as it is (the same pods and image, the operator's help off:
torch's own timeouts, no leave hook, a rendezvous that only stores). Full chain: real nodes,
the operator deployed from deploy/, real torchrun, the volume from the local-path provisioner.

Each round at 4 workers: ScaleIn by count (4 -> 3), ScaleOut +1 (3 -> 4), a worker SIGKILLed
(4 -> 3; not replaced), `kubectl scale` back to 4, `kubectl drain` of a worker's node (an
eviction, 4 -> 3), `kubectl scale` back to 4. The same rounds for a Horovod job under
etoperator (examples/training_job.yaml at 4 workers, its launcher's log) in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Row, pct
from bench.training import long_example
from etoperator.naming import ANN_TORCHRUN_PLAIN
from localcluster.manifests import scalein, scaleout, torchrun_job
from localcluster.torchlogs import Logbook
from localcluster.tour import Training, own_lines
from localcluster.world import Chain, Timeout, start_chain, wait_for

JOB = "t1"
SIZE = 4
ARGS = ["--steps", "10000000", "--step-sleep", "0.05", "--save-every", "10"]
KINDS = ("ScaleIn", "ScaleOut", "kill", "drain", "kubectl scale")
GOAL = 10.0  # seconds, every figure under etoperator at 4 workers (p95)


FirstAt = Callable[[int, float], float | None]  # (size, after) -> rank 0's first step then
Took = dict[str, list[float]]
Steps = Callable[[Chain, str], tuple[FirstAt, Any]]  # how a job's rank-0 steps are read


def t1(tmp: Path, rounds: int) -> list[Row]:
    """Torchrun under etoperator, Horovod under etoperator, then torchrun as it is, each for
    `rounds` (torchrun's own changes take 40-50 s each: ten rounds of it alone are about 45
    minutes). Each job's figures are printed as soon as its rounds end; a job whose round
    fails keeps the figures of the rounds before, and says why."""
    c = start_chain(tmp / "chain", nodes=2)
    try:
        ours = measure(c, rounds, torchrun_body(plain=False), torchrun_steps, "etoperator")
        horovod = measure(c, rounds, horovod_body(), horovod_steps, "Horovod")
        theirs = measure(c, rounds, torchrun_body(plain=True), torchrun_steps, "torchrun as it is")
    finally:
        c.stop()
    return rows(ours, theirs, horovod, rounds)


def t1_horovod(tmp: Path, rounds: int) -> list[Row]:
    """T1's Horovod figures alone (after a change of Horovod's build: the other two take
    most of an hour and do not move with it)."""
    return t1_alone(tmp, rounds, horovod_body(), horovod_steps, "Horovod under etoperator", "")


def t1_torchrun(tmp: Path, rounds: int) -> list[Row]:
    """T1's Torchrun figures under etoperator alone (after a change of the agent, the
    example or the operator's Torchrun side: torchrun as it is does not move with them)."""
    body, goal = torchrun_body(plain=False), f"<= {GOAL:.0f} s at p95"
    return t1_alone(tmp, rounds, body, torchrun_steps, "Torchrun under etoperator", goal)


def t1_alone(
    tmp: Path, rounds: int, body: dict[str, Any], steps: Steps, who: str, goal: str
) -> list[Row]:
    c = start_chain(tmp / "chain", nodes=2)
    try:
        took = measure(c, rounds, body, steps, who)
    finally:
        c.stop()
    return [("T1", f"{kind} -> first step at the new size ({who}, {len(took[kind])})",
             spread(took[kind]), goal)
            for kind in KINDS]  # fmt: skip


def torchrun_body(plain: bool) -> dict[str, Any]:
    body = torchrun_job(JOB, SIZE, ARGS, minReplicas=1, maxReplicas=SIZE + 2)
    # Time is measured, not the restart budget: torchrun as it is counts every change a
    # failure (its job failed after four), and each round kills a worker.
    body["spec"]["elasticPolicy"] = {"maxRestarts": 1000}
    if plain:
        body["metadata"]["annotations"] = {ANN_TORCHRUN_PLAIN: "true"}
    return body


def horovod_body() -> dict[str, Any]:
    body = long_example(SIZE)
    body["metadata"]["name"] = JOB
    body["spec"]["etReplicaSpecs"]["worker"]["maxReplicas"] = SIZE + 2
    return body


def torchrun_steps(c: Chain, ns: str) -> tuple[FirstAt, Callable[[], None]]:
    """Rank 0's steps, read from the workers' logs all along; and how to stop reading."""
    book = Logbook(c, ns, JOB)
    return book.first_at, book.done.set


def horovod_steps(c: Chain, ns: str) -> tuple[FirstAt, Callable[[], None]]:
    """Rank 0's steps, from the launcher's log (horovodrun gathers every rank's output)."""
    return Training(lambda: c.pod_log(ns, f"{JOB}-launcher")).first_step_at, lambda: None


def rows(ours: Took, theirs: Took, horovod: Took, rounds: int) -> list[Row]:
    out: list[Row] = []
    for kind in KINDS:
        a, b, h = ours[kind], theirs[kind], horovod[kind]
        speedup = pct(b, 0.5) / pct(a, 0.5) if a and b and pct(a, 0.5) else 0.0
        goal = f"<= {GOAL:.0f} s at p95" + (
            "; >= 3x torchrun's" if kind in ("ScaleIn", "kill") else ""
        )
        out.append(
            ("T1", f"{kind} -> first step at the new size (etoperator, {len(a)})", spread(a), goal)
        )
        out.append(
            ("T1", f"... torchrun as it is ({len(b)}): {speedup:.1f}x slower", spread(b), "")
        )
        out.append(("T1", f"... Horovod under etoperator ({len(h)})", spread(h), ""))
    out.append(("T1", f"rounds at {SIZE} workers, each runtime", str(rounds),
                ">= 10 for the goal"))  # fmt: skip
    return out


def spread(v: list[float]) -> str:
    return f"p50 {pct(v, 0.5):.2f}s, p95 {pct(v, 0.95):.2f}s" if v else "none"


def measure(
    c: Chain,
    rounds: int,
    body: dict[str, Any],
    steps: Steps,
    who: str,
) -> Took:
    ns = c.new_namespace()
    c.create(body, ns)
    first_at, stop_reading = steps(c, ns)
    took: Took = {k: [] for k in KINDS}
    try:
        wait_for(lambda: first_at(SIZE, 0), 300, f"training at {SIZE}", 0.5)
        for r in range(rounds):
            one_round(c, ns, first_at, r, took)
    except Timeout as exc:  # the rounds before stand; what the job said is printed
        print(f"T1 {who}: round failed: {exc}", flush=True)
        for pod in c.pods(ns, JOB, live=False):
            print(f"--- {pod} ---", *own_lines(c.pod_log(ns, pod), 40), sep="\n", flush=True)
    finally:
        stop_reading()
        c.delete_namespace(ns)
    print(f"T1 {who}: " + "; ".join(f"{k} {spread(v)} ({len(v)})" for k, v in took.items()),
          flush=True)  # fmt: skip
    return took


def one_round(c: Chain, ns: str, first_at: FirstAt, r: int, took: Took) -> None:
    def timed(kind: str, size: int, act: Callable[[], object]) -> None:
        t0 = time.time()
        act()
        t = wait_for(lambda: first_at(size, t0), 300, f"{kind}: training at {size}", 0.2)
        assert t is not None
        took[kind].append(t - t0)

    timed("ScaleIn", SIZE - 1, lambda: c.create(scalein(f"in-{r}", JOB, count=1, timeout=120), ns))
    timed("ScaleOut", SIZE, lambda: c.create(scaleout(f"out-{r}", JOB, 1, timeout=300), ns))
    timed("kill", SIZE - 1, lambda: c.kill(ns, workers(c, ns)[0]))
    timed("kubectl scale", SIZE, lambda: scale(c, ns, SIZE))
    timed("drain", SIZE - 1, lambda: drain(c, ns, workers(c, ns)[-1]))
    c.kubectl("uncordon", *node_names(c))
    scale(c, ns, SIZE)
    back = time.time()
    wait_for(lambda: first_at(SIZE, back), 300, "back at 4", 0.5)


def workers(c: Chain, ns: str) -> list[str]:
    return c.pods(ns, JOB, "worker")


def scale(c: Chain, ns: str, n: int) -> None:
    wait_for(lambda: c.phase(ns, JOB) == "Running", 120, "a job that may scale", 0.5)
    c.kubectl("scale", "trainingjob", JOB, "-n", ns, "--replicas", str(n))


def drain(c: Chain, ns: str, pod: str) -> None:
    node = c.obj("Pod", ns, pod)["spec"]["nodeName"]
    index = pod.rsplit("-", 1)[1]
    c.kubectl(
        "drain", node, f"--pod-selector=training-job-name={JOB},replica-index={index}",
        "--ignore-daemonsets", "--timeout=120s",
    )  # fmt: skip


def node_names(c: Chain) -> list[str]:
    assert c.local.real is not None
    return [n.name for n in c.local.real.nodes]
