"""P5, P7, P8, P9: the operator at scale on hollow nodes (passes, writes, CPU, memory)."""

from __future__ import annotations

import re
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import (
    STEPS,
    Row,
    Timeline,
    at,
    buckets_of,
    cpu_by_part,
    histogram_quantile,
    hollow,
    operator_requests,
    operator_write_events,
    operator_writes,
    over,
    pct,
    rss_mib,
    scrape,
    server_seconds,
    step_label,
    step_p99,
)
from localcluster.manifests import job, scalein, scaleout
from localcluster.world import (
    Hollow,
    World,
    wait_for,
)


def p5(tmp: Path, jobs: int, workers: int) -> list[Row]:
    # The control plane alone: no sshd per worker (ssh checks off), so the figures are the
    # operator's own cost at this scale.
    c = hollow(tmp, jobs * (workers + 1))
    try:
        ns = c.new_namespace()
        t0, wall0, cpu0 = time.monotonic(), time.time(), cpu_by_part(c)
        for i in range(jobs):
            c.create(job(f"j{i}", replicas=workers), ns)
        running = partial(
            lambda: sum(
                1
                for j in c.api.list("TrainingJob", ns)
                if (j.get("status") or {}).get("phase") == "Running"
            )
        )
        wait_for(lambda: running() == jobs, 3600, "all jobs Running", interval=5)
        settle, cpu = time.monotonic() - t0, cpu_by_part(c)
        used = sorted(((cpu[k] - cpu0[k], k) for k in cpu), reverse=True)
        events = operator_write_events(c, wall0, time.time())
        writes, served = operator_writes(events), server_seconds(events)
        lag = launcher_lag(c.api.list("Pod", ns), events)
        made = [  # the workers a first pass creates
            at(e["stageTimestamp"])
            for e in events
            if e["verb"] == "create"
            and (ref := e.get("objectRef") or {}).get("resource") == "pods"
            and "-worker-" in ref.get("name", "")
        ]
        metrics = scrape(c)
        p50 = histogram_quantile(metrics, "etoperator_reconcile_duration_seconds", 0.5)
        p99 = histogram_quantile(metrics, "etoperator_reconcile_duration_seconds", 0.99)
        passes = dict(buckets_of(metrics, "etoperator_reconcile_duration_seconds"))
        waits = "etoperator_pass_wait_seconds"
        waited = [
            histogram_quantile(metrics, waits, q, labels=f'job="{kind}"')
            for kind in ("new", "started")
            for q in (0.5, 0.99)
        ]
        stale = re.search(r"^etoperator_stale_views_total ([0-9.e+]+)$", metrics, re.M)
        slow = f"{passes[float('inf')] - passes[0.5]:.0f} of {passes[float('inf')]:.0f}"
        slow += f" ({float(stale[1]) if stale else 0:.0f} not run: the cache behind a write)"
        slow_passes = slow_pass_summary(c.operator.log.read_text(errors="replace"))
        by_step = ", ".join(
            f"{step} {step_p99(metrics, step)} ({over(metrics, step)} over 0.5)"
            for step in ("basics", "views", "plan", "writes", "children")
        )
        wait_for(
            lambda: not operator_requests(c, time.time() - 10, time.time()),
            120,
            "quiet",
            interval=2,
        )
        window = 120.0  # two resyncs of every job fall in it
        start, at_start = time.time(), scrape(c)
        wait_for(lambda: time.time() >= start + window + 2, window + 10, interval=1)
        verbs = operator_requests(c, start, start + window)
        steady = scrape(c)
        s50 = histogram_quantile(steady, "etoperator_reconcile_duration_seconds", 0.5, at_start)
        s99 = histogram_quantile(steady, "etoperator_reconcile_duration_seconds", 0.99, at_start)
        lists = sum(1 for v in verbs if v == "list")
        return [
            ("P5", f"{jobs} jobs x {workers} workers: all Running after", f"{settle:.1f}s", ""),
            ("P5", "... every worker pod created after (first passes done)",
             f"{max(made) - wall0:.1f}s", ""),
            ("P5", "... a job's launcher created after the apiserver had its last worker Running "
             "(the operator's share of the wait), p50 / p99 / max; the hollow kubelets' "
             "report of a worker Ready, p50 / p99", lag, ""),
            ("P5", "reconcile pass p50 / p99 while starting (50 ms buckets)",
             f"<= {p50}s / <= {p99}s", "p99 <= 0.5 s"),
            ("P5", "... passes over 0.5 s while starting", slow, ""),
            ("P5", "... a woken job's wait for a free thread, p50 / p99: new jobs; started",
             f"<= {waited[0]}s / <= {waited[1]}s; <= {waited[2]}s / <= {waited[3]}s", ""),
            ("P5", "... p99 of each step of a pass (<= s)", by_step, ""),
            ("P5", "... the slow passes (operator log): by the job's phase; their time outside "
             "the steps, p50 / max", slow_passes, ""),
            ("P5", "... the apiserver's own time over the operator's writes, p50 / p99 (n)",
             ", ".join(f"{v} {pct(t, 0.5):.3f} / {pct(t, 0.99):.3f} s ({len(t)})"
                       for v, t in sorted(served.items())), ""),
            ("P5", "... CPU seconds by part (2 cores)",
             ", ".join(f"{k} {v:.0f}" for v, k in used), ""),
            ("P5", "... operator writes per job",
             ", ".join(f"{k} {n / jobs:.1f}" for k, n in writes.most_common(8)), ""),
            ("P5", "reconcile pass p50 / p99 once steady", f"<= {s50}s / <= {s99}s",
             "p99 <= 0.5 s"),
            ("P5", "operator RSS", f"{rss_mib(c.operator.proc)} MiB", "<= 300 MiB"),
            ("P5", "operator requests per minute, steady",
             f"{len(verbs) * 60 / window:.1f} ({lists} LIST)",
             f"no LIST, < {jobs / 10:.0f} (1 per job per 10 min)"),
        ]  # fmt: skip
    finally:
        c.stop()


def launcher_lag(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> str:
    """How long after the apiserver had a job's last worker Running (that pod's last status
    write, from its managedFields: 1 s resolution) the operator created its launcher (the
    audit log), over all jobs; and how long the kubelets took to report a worker Ready (the
    condition's time -> that status write)."""
    ready: dict[str, float] = {}
    reported: list[float] = []
    for pod in pods:
        name, meta = pod["metadata"]["name"], pod["metadata"]
        wrote = [at(m["time"]) for m in meta.get("managedFields") or [] if m.get("subresource")]
        conds = (pod.get("status") or {}).get("conditions") or []
        since = [at(c["lastTransitionTime"]) for c in conds if c["type"] == "Ready"]
        if "-worker-" in name and wrote:
            job = name.rsplit("-worker-", 1)[0]
            ready[job] = max(ready.get(job, 0.0), max(wrote))
            reported += [max(wrote) - since[0]] if since else []
    lags = [
        at(e["stageTimestamp"]) - ready[job]
        for e in events
        if e["verb"] == "create"
        and (ref := e.get("objectRef") or {}).get("resource") == "pods"
        and ref.get("name", "").endswith("-launcher")
        and (job := ref["name"].removesuffix("-launcher")) in ready
    ]
    if not lags or not reported:
        return "none"
    return (
        f"{pct(lags, 0.5):.1f} / {pct(lags, 0.99):.1f} / {max(lags):.1f} s ({len(lags)}); "
        f"kubelets' report {pct(reported, 0.5):.0f} / {pct(reported, 0.99):.0f} s"
    )


def slow_pass_summary(log_text: str) -> str:
    """The operator's "Slow pass" lines: how many by the job's phase, and how much of their
    time no step accounts for (the thread waiting to run, or work between steps)."""
    phases: Counter[str] = Counter()
    outside: list[float] = []
    for m in re.finditer(r"Slow pass .* phase=(\S+) took=([0-9.]+)s(.*)", log_text):
        phases[m[1]] += 1
        steps = sum(float(v) for v in re.findall(r"=([0-9.]+)s", m[3]))
        outside.append(float(m[2]) - steps)
    if not outside:
        return "none"
    by_phase = ", ".join(f"{p} {n}" for p, n in phases.most_common())
    return f"{by_phase}; {pct(outside, 0.5):.2f} / {max(outside):.2f} s"


def p7(tmp: Path, jobs: int = 20, minutes: float = 5.0) -> list[Row]:
    """Jobs scaling out and in without pause: request -> ScaleSucceeded, minus pod start."""
    import threading

    c = hollow(tmp, jobs * 6)
    outs: list[float] = []
    ins: list[float] = []
    failures: list[str] = []
    try:
        ns = c.new_namespace()
        for i in range(jobs):
            c.create(job(f"s{i}", replicas=2, maxReplicas=4), ns)
        wait_for(lambda: all(c.phase(ns, f"s{i}") == "Running" for i in range(jobs)), 300,
                 interval=1)  # fmt: skip
        tl = Timeline(c, ns)
        end = time.monotonic() + minutes * 60
        steps: dict[str, list[float]] = {}

        def step(name: str, since: float, until: float) -> None:
            steps.setdefault(name, []).append(until - since)

        def scale(kind: str, name: str, manifest: dict[str, object]) -> tuple[float, float]:
            """(when it was asked for, when it ended)."""
            t0 = time.monotonic()
            c.create(manifest, ns)
            ended = partial(
                lambda: tl.seen(("ScaleSucceeded", name)) or tl.seen(("ScaleFailed", name))
            )
            wait_for(ended, 120, interval=0.05)
            if not tl.seen(("ScaleSucceeded", name)):
                failures.append(name)
                return t0, time.monotonic()
            wait_for(partial(tl.seen, ("Scaling", name)), 5, interval=0.05)
            step(f"{kind}: created -> Scaling (the operator took it)", t0, tl.at["Scaling", name])
            return t0, tl.at["ScaleSucceeded", name]

        def scale_out(j: str, n: int) -> None:
            name = f"{j}-o{n}"
            t0, done = scale("ScaleOut", name, scaleout(name, j, 1))
            (pod,) = c.status(ns, name, "ScaleOut").get("addPods") or [""]
            if name in failures or not pod:
                return
            wait_for(partial(tl.seen, ("created", pod), ("running", pod), ("listed", pod)), 10,
                     interval=0.05)  # fmt: skip
            at = partial(lambda what: tl.at[what, pod])
            step("ScaleOut: Scaling -> pod created", tl.at["Scaling", name], at("created"))
            step("ScaleOut: pod created -> Running (scheduler, kubelet: not ours)",
                 at("created"), at("running"))  # fmt: skip
            step("ScaleOut: pod Running -> host listed", at("running"), at("listed"))
            step("ScaleOut: host listed -> ScaleSucceeded", at("listed"), done)
            outs.append(done - t0 - (at("running") - at("created")))  # the pod's start is not ours

        def scale_in(j: str, n: int) -> None:
            # A hollow pod cannot be asked whether Horovod left it (the apiserver cannot reach
            # a hollow kubelet for pods/exec): the drain check always waits out the scaler's
            # timeout, here its 1 s minimum, and is left out of the figure.
            name = f"{j}-i{n}"
            t0, done = scale("ScaleIn", name, scalein(name, j, count=1, timeout=1))
            (pod,) = c.status(ns, name, "ScaleIn").get("toDeletePods") or [""]
            if name in failures or not pod:
                return
            wait_for(partial(tl.seen, ("unlisted", pod), ("deleted", pod)), 10, interval=0.05)
            at = partial(lambda what: tl.at[what, pod])
            step("ScaleIn: Scaling -> victim unlisted", tl.at["Scaling", name], at("unlisted"))
            step("ScaleIn: unlisted -> ScaleSucceeded (the 1 s drain timeout)", at("unlisted"),
                 done)  # fmt: skip
            step("ScaleIn: ScaleSucceeded -> pod deleted", done, at("deleted"))
            ins.append(at("unlisted") - t0)

        def loop(j: str) -> None:
            n = 0
            while time.monotonic() < end:
                n += 1
                scale_out(j, n)
                scale_in(j, n)

        threads = [threading.Thread(target=loop, args=(f"s{i}",)) for i in range(jobs)]
        wall0, cpu0, metrics0 = time.time(), cpu_by_part(c), scrape(c)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        where = where_time_went(c, wall0, cpu0, metrics0, max(1, len(outs) + len(ins)))
        return [
            ("P7", f"{jobs} jobs scaling {minutes:.0f} min: ScaleOut, minus pod start",
             f"p50 {pct(outs, 0.5):.2f}s, p99 {pct(outs, 0.99):.2f}s ({len(outs)})", "p99 <= 2 s"),
            ("P7", "ScaleIn -> victim unlisted (no drain check on hollow nodes)",
             f"p50 {pct(ins, 0.5):.2f}s, p99 {pct(ins, 0.99):.2f}s ({len(ins)})", "p99 <= 2 s"),
            ("P7", "scalers that failed", str(len(failures)), "0"),
            *(("P7", f"  {what}", f"p50 {pct(took, 0.5):.2f}s, p99 {pct(took, 0.99):.2f}s", "")
              for what, took in steps.items()),
            *(("P7", what, figure, "") for what, figure in where),
        ]  # fmt: skip
    finally:
        c.stop()


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


STARTED = 'job="started"'


P9_STEPS = (250, 500, 1000, 2000)


def p9(tmp: Path, steps: tuple[int, ...] = P9_STEPS, budget: float = 1800) -> list[Row]:
    """One operator replica, jobs of 2 workers added in steps until its steady pass p99 passes
    0.5 s or its RSS 1 GiB, or the hollow nodes cannot start the pods within `budget` seconds
    (on 2 cores they, not the operator, are what runs out first)."""
    c = hollow(tmp, max(steps) * 3)
    rows: list[Row] = []
    deadline = time.monotonic() + budget
    pass_seconds = "etoperator_reconcile_duration_seconds"
    try:
        ns, made = c.new_namespace(), 0
        for target in steps:
            t0 = time.monotonic()
            for i in range(made, target):
                c.create(job(f"p{i}", replicas=2), ns)
            made = target
            try:
                wait_for(partial(all_running_jobs, c, ns, target), max(0.0, deadline - t0),
                         "all jobs Running", interval=5)  # fmt: skip
            except AssertionError:
                limit = f"the hollow nodes' limit on 2 cores ({budget:.0f} s budget)"
                rows.append(("P9", f"{target} jobs: stopped", "not all Running in time", limit))
                break
            took = time.monotonic() - t0
            wait_for(lambda: not operator_requests(c, time.time() - 10, time.time()), 300,
                     "quiet", interval=2)  # fmt: skip
            start = scrape(c)
            wait_for(partial(time_passed, time.monotonic() + 60), 70, interval=1)
            s99 = histogram_quantile(scrape(c), pass_seconds, 0.99, start)
            rss = rss_mib(c.operator.proc)
            what = f"{target} jobs x 2 workers: steady pass p99, RSS, all Running after"
            got = f"<= {s99}s, {rss} MiB, {took:.0f}s"
            rows.append(("P9", what, got, "p99 <= 0.5 s, RSS <= 1024 MiB"))
            print("  ".join(rows[-1]), flush=True)
            if s99 > 0.5 or rss > 1024:
                rows.append(("P9", f"{target} jobs: stopped", "the operator's limit", ""))
                break
        return rows
    finally:
        c.stop()


def all_running_jobs(c: World, ns: str, count: int) -> bool:
    jobs = c.api.list("TrainingJob", ns)
    return sum(1 for j in jobs if (j.get("status") or {}).get("phase") == "Running") == count


def time_passed(when: float) -> bool:
    return time.monotonic() >= when


def p8(tmp: Path, jobs: int = 10) -> list[Row]:
    """Two replicas; the leader SIGKILLed while every job scales out."""
    from localcluster.operatorproc import OperatorProcess

    c = hollow(tmp, jobs * 4)
    try:
        c.operator.stop()
        base = c.operator
        pair = {
            n: OperatorProcess(base.kubeconfig, base.log.with_name(f"{n}.log"), base.ssh_port,
                               extra=[*base.extra, "--leader-election",
                                      "--lease-namespace", "etoperator-system"],
                               env={"POD_NAME": n})
            for n in ("replica-a", "replica-b")
        }  # fmt: skip
        for proc in pair.values():
            proc.start()

        def holder() -> str:
            lease = c.api.get("Lease", "etoperator-system", "etoperator") or {}
            return str((lease.get("spec") or {}).get("holderIdentity") or "")

        leader = wait_for(holder, 30)
        ns = c.new_namespace()
        for i in range(jobs):
            c.create(job(f"h{i}", replicas=2, maxReplicas=4), ns)
        wait_for(lambda: all(c.phase(ns, f"h{i}") == "Running" for i in range(jobs)), 300,
                 interval=1)  # fmt: skip
        for node in c.nodes():  # the new workers stay Pending until the leader is killed
            c.kubectl("cordon", node)
        for i in range(jobs):
            c.create(scaleout(f"grow{i}", f"h{i}", 1), ns)
        wait_for(lambda: all(c.status(ns, f"grow{i}", "ScaleOut").get("addPods")
                             for i in range(jobs)), 60)  # fmt: skip
        pair[leader].kill()
        killed = time.monotonic()
        for node in c.nodes():
            c.kubectl("uncordon", node)
        wait_for(lambda: holder() not in ("", leader), 60, interval=0.1)
        took_over = time.monotonic() - killed
        done = partial(lambda: all(c.phase(ns, f"grow{i}", "ScaleOut") == "ScaleSucceeded"
                                   for i in range(jobs)))  # fmt: skip
        wait_for(done, 60, interval=0.2)
        finished = time.monotonic() - killed
        duplicates = orphans = stuck = 0
        for i in range(jobs):
            target = c.status(ns, f"h{i}").get("targetWorkers") or []
            pods = c.pods(ns, f"h{i}", "worker")
            duplicates += max(0, len(pods) - len(set(target)))
            orphans += len(set(pods) - set(target))
            stuck += c.phase(ns, f"grow{i}", "ScaleOut") != "ScaleSucceeded"
        for proc in pair.values():
            proc.stop()
        return [
            ("P8", "leader SIGKILLed mid-scale: standby holds the Lease after",
             f"{took_over:.1f}s", "<= 15 s"),
            ("P8", f"... and all {jobs} in-flight ScaleOuts succeeded after", f"{finished:.1f}s",
             ""),
            ("P8", "duplicate / orphan pods, stuck scalers", f"{duplicates} / {orphans} / {stuck}",
             "0 / 0 / 0"),
        ]  # fmt: skip
    finally:
        c.stop()
