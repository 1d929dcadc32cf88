"""P7: jobs scaling out and in without pause on hollow nodes: request -> ScaleSucceeded,
minus the pod's start, step by step, and where the time went."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.common import (
    STEPS,
    Row,
    Timeline,
    cpu_by_part,
    histogram_quantile,
    hollow,
    operator_write_events,
    operator_writes,
    pct,
    scrape,
    server_seconds,
    step_label,
)
from localcluster.manifests import job, scalein, scaleout
from localcluster.world import Hollow, wait_for

STARTED = 'job="started"'


@dataclass
class ScaleLoop:
    """Each job's ScaleOut then ScaleIn of one worker, again and again until `end`; what each
    took, and each step of it, from the job's timeline."""

    c: Hollow
    ns: str
    tl: Timeline
    end: float
    outs: list[float] = field(default_factory=list)
    ins: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    steps: dict[str, list[float]] = field(default_factory=dict)

    def step(self, name: str, since: float, until: float) -> None:
        self.steps.setdefault(name, []).append(until - since)

    def scale(self, kind: str, name: str, manifest: dict[str, object]) -> tuple[float, float]:
        """(when it was asked for, when it ended)."""
        tl, t0 = self.tl, time.monotonic()
        self.c.create(manifest, self.ns)
        ended = partial(lambda: tl.seen(("ScaleSucceeded", name)) or tl.seen(("ScaleFailed", name)))
        wait_for(ended, 120, interval=0.05)
        if not tl.seen(("ScaleSucceeded", name)):
            self.failures.append(name)
            return t0, time.monotonic()
        wait_for(partial(tl.seen, ("Scaling", name)), 5, interval=0.05)
        self.step(f"{kind}: created -> Scaling (the operator took it)", t0, tl.at["Scaling", name])
        return t0, tl.at["ScaleSucceeded", name]

    def scale_out(self, j: str, n: int) -> None:
        name = f"{j}-o{n}"
        t0, done = self.scale("ScaleOut", name, scaleout(name, j, 1))
        (pod,) = self.c.status(self.ns, name, "ScaleOut").get("addPods") or [""]
        if name in self.failures or not pod:
            return
        tl = self.tl
        wait_for(partial(tl.seen, ("created", pod), ("running", pod), ("listed", pod)), 10,
                 interval=0.05)  # fmt: skip
        at = partial(lambda what: tl.at[what, pod])
        self.step("ScaleOut: Scaling -> pod created", tl.at["Scaling", name], at("created"))
        self.step("ScaleOut: pod created -> Running (scheduler, kubelet: not ours)",
                  at("created"), at("running"))  # fmt: skip
        self.step("ScaleOut: pod Running -> host listed", at("running"), at("listed"))
        self.step("ScaleOut: host listed -> ScaleSucceeded", at("listed"), done)
        self.outs.append(done - t0 - (at("running") - at("created")))  # the pod's start: not ours

    def scale_in(self, j: str, n: int) -> None:
        # A hollow pod cannot be asked whether Horovod left it (the apiserver cannot reach
        # a hollow kubelet for pods/exec): the drain check always waits out the scaler's
        # timeout, here its 1 s minimum, and is left out of the figure.
        name = f"{j}-i{n}"
        t0, done = self.scale("ScaleIn", name, scalein(name, j, count=1, timeout=1))
        (pod,) = self.c.status(self.ns, name, "ScaleIn").get("toDeletePods") or [""]
        if name in self.failures or not pod:
            return
        tl = self.tl
        wait_for(partial(tl.seen, ("unlisted", pod), ("deleted", pod)), 10, interval=0.05)
        at = partial(lambda what: tl.at[what, pod])
        self.step("ScaleIn: Scaling -> victim unlisted", tl.at["Scaling", name], at("unlisted"))
        self.step("ScaleIn: unlisted -> ScaleSucceeded (the 1 s drain timeout)", at("unlisted"),
                  done)  # fmt: skip
        self.step("ScaleIn: ScaleSucceeded -> pod deleted", done, at("deleted"))
        self.ins.append(at("unlisted") - t0)

    def loop(self, j: str) -> None:
        n = 0
        while time.monotonic() < self.end:
            n += 1
            self.scale_out(j, n)
            self.scale_in(j, n)


def p7(tmp: Path, jobs: int = 20, minutes: float = 5.0) -> list[Row]:
    """Jobs scaling out and in without pause: request -> ScaleSucceeded, minus pod start."""
    c = hollow(tmp, jobs * 6)
    try:
        ns = c.new_namespace()
        for i in range(jobs):
            c.create(job(f"s{i}", replicas=2, maxReplicas=4), ns)
        wait_for(lambda: all(c.phase(ns, f"s{i}") == "Running" for i in range(jobs)), 300,
                 interval=1)  # fmt: skip
        run = ScaleLoop(c, ns, Timeline(c, ns), time.monotonic() + minutes * 60)
        threads = [threading.Thread(target=run.loop, args=(f"s{i}",)) for i in range(jobs)]
        wall0, cpu0, metrics0 = time.time(), cpu_by_part(c), scrape(c)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        scales = max(1, len(run.outs) + len(run.ins))
        return rows(run, jobs, minutes, where_time_went(c, wall0, cpu0, metrics0, scales))
    finally:
        c.stop()


def rows(run: ScaleLoop, jobs: int, minutes: float, where: list[tuple[str, str]]) -> list[Row]:
    outs, ins = run.outs, run.ins
    return [
        ("P7", f"{jobs} jobs scaling {minutes:.0f} min: ScaleOut, minus pod start",
         f"p50 {pct(outs, 0.5):.2f}s, p99 {pct(outs, 0.99):.2f}s ({len(outs)})", "p99 <= 2 s"),
        ("P7", "ScaleIn -> victim unlisted (no drain check on hollow nodes)",
         f"p50 {pct(ins, 0.5):.2f}s, p99 {pct(ins, 0.99):.2f}s ({len(ins)})", "p99 <= 2 s"),
        ("P7", "scalers that failed", str(len(run.failures)), "0"),
        *(("P7", f"  {what}", f"p50 {pct(took, 0.5):.2f}s, p99 {pct(took, 0.99):.2f}s", "")
          for what, took in run.steps.items()),
        *(("P7", what, figure, "") for what, figure in where),
    ]  # fmt: skip


def where_time_went(
    c: Hollow, wall0: float, cpu0: dict[str, float], metrics0: str, scales: int
) -> list[tuple[str, str]]:
    """Since `wall0`: the operator's passes and their wait for a thread, the apiserver's own
    time over the operator's writes, and who took the cores (P7's tail is one of these)."""
    metrics, cpu = scrape(c), cpu_by_part(c)

    def upto(name: str, q: float, labels: str = "") -> float:
        return histogram_quantile(metrics, name, q, metrics0, labels)

    passes, waits = "etoperator_reconcile_duration_seconds", "etoperator_pass_wait_seconds"
    steps = ("views", "plan", "writes", "children")
    events = operator_write_events(c, wall0, time.time())
    served, writes = server_seconds(events), operator_writes(events)
    used = sorted(((cpu[k] - cpu0[k], k) for k in cpu), reverse=True)
    return [
        ("... reconcile pass p50 / p99", f"<= {upto(passes, 0.5)}s / <= {upto(passes, 0.99)}s"),
        ("... a woken job's wait for a free thread, p50 / p99",
         f"<= {upto(waits, 0.5, STARTED)}s / <= {upto(waits, 0.99, STARTED)}s"),
        ("... p99 of each step of a pass (<= s)",
         ", ".join(f"{step} {upto(STEPS, 0.99, step_label(step))}" for step in steps)),
        ("... the apiserver's own time over the operator's writes, p50 / p99 (n)",
         ", ".join(f"{v} {pct(t, 0.5):.3f} / {pct(t, 0.99):.3f} s ({len(t)})"
                   for v, t in sorted(served.items()) if v in ("create", "delete", "patch"))),
        ("... CPU seconds by part (2 cores)", ", ".join(f"{k} {v:.0f}" for v, k in used)),
        ("... operator writes per scale (n)",
         ", ".join(f"{k} {n / scales:.1f}" for k, n in writes.most_common(10))),
    ]  # fmt: skip
