"""Benchmarks: `make bench` (or `python -m bench [--only p1 p5 p7 p8 p4 p6 a1 ...]`).

Prints a table of figures against their goals. Not pass/fail: a figure that misses its goal is
printed as such. Uses the local cluster: P5, P7, P8 and P9 the real control plane with
kube-scheduler and hollow nodes (kubemark: the real kubelet over a fake runtime), the operator
as a real process under its deploy/ RBAC; P1-P4, P6, A1 and P10 real nodes (containerd, the
shipped images, workers with a real sshd, the operator deployed from deploy/, real horovodrun
training where the figure is training's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from etoperator import naming
from localcluster import digits, procs
from localcluster.cluster import OPERATOR_USER
from localcluster.manifests import job, scalein, scaleout
from localcluster.tour import EXAMPLE as TOUR_EXAMPLE
from localcluster.tour import JOB as TOUR_JOB
from localcluster.tour import Training
from localcluster.world import (
    ROOT,
    Chain,
    Hollow,
    World,
    start_chain,
    start_hollow,
    wait_for,
)

Row = tuple[str, str, str, str]
GROUP, VERSION = "kai.alibabacloud.com", "v1alpha1"
STEPS = "etoperator_pass_step_seconds"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}s, p95 {pct(values, 0.95):.2f}s"


DISCOVERY_WINDOW = 120.0
# Pods per hollow node: few processes (each hollow kubelet is one) for thousands of pods.
HOLLOW_PODS = 500


def hollow(tmp: Path, pods: int) -> Hollow:
    """Hollow nodes with room for `pods`; the operator without SSH checks (nothing runs in a
    hollow pod), so the figures are the operator's own cost at that scale."""
    nodes = -(-pods // HOLLOW_PODS)
    return start_hollow(tmp, nodes, HOLLOW_PODS, ["--no-ssh-checks"])


class Timeline:
    """When things first happened in a namespace, from watches (what the apiserver shows, as
    any client would see it): each pod created, Running and deleted; each host listed and
    unlisted in a job's ConfigMap; each scaler's phases. A scale's time splits into steps."""

    def __init__(self, c: World, ns: str) -> None:
        import threading

        from kubernetes import client

        self.c, self.ns = c, ns
        self.at: dict[tuple[str, str], float] = {}  # (what, name) -> first seen
        core, custom = client.CoreV1Api(c.api.api), client.CustomObjectsApi(c.api.api)
        streams: list[tuple[Callable[..., Any], tuple[Any, ...], Callable[[str, Any], None]]] = [
            (core.list_namespaced_pod, (ns,), self._pod),
            (core.list_namespaced_config_map, (ns,), self._configmap),
            *((custom.list_namespaced_custom_object, (GROUP, VERSION, ns, plural), self._scaler)
              for plural in ("scaleouts", "scaleins")),
        ]  # fmt: skip
        for lister, args, on in streams:
            threading.Thread(target=self._run, args=(lister, args, on), daemon=True).start()

    def first(self, what: str, name: str) -> None:
        self.at.setdefault((what, name), time.monotonic())

    def seen(self, *keys: tuple[str, str]) -> bool:
        return all(k in self.at for k in keys)

    def ended(self, scaler: str) -> bool:
        return self.seen(("ScaleSucceeded", scaler)) or self.seen(("ScaleFailed", scaler))

    def _pod(self, etype: str, pod: Any) -> None:
        name = pod.metadata.name
        self.first("created", name)
        if pod.spec.node_name:
            self.first("bound", name)
        if pod.status.phase == "Running":
            self.first("running", name)
        if etype == "DELETED" or pod.metadata.deletion_timestamp:
            self.first("deleted", name)

    def _configmap(self, etype: str, cm: Any) -> None:
        hosts = {line.split(":")[0] for line in ((cm.data or {}).get("hostfile") or "").split()}
        for host in hosts:
            self.first("listed", host)
        workers = cm.metadata.name.removesuffix("config") + "worker-"
        for what, name in list(self.at):
            if what == "listed" and name not in hosts and name.startswith(workers):
                self.first("unlisted", name)

    def _scaler(self, etype: str, body: Any) -> None:
        phase = (body.get("status") or {}).get("phase")
        if phase:
            self.first(phase, body["metadata"]["name"])

    def _run(self, lister: Callable[..., Any], args: tuple[Any, ...], on: Any) -> None:
        from kubernetes import watch

        while True:
            try:
                for ev in watch.Watch().stream(lister, *args, timeout_seconds=300):
                    on(ev["type"], ev["object"])
            except Exception:  # a watch that ends is opened again
                time.sleep(0.1)


def discover(c: World, ns: str, name: str, tmp: Path) -> Callable[[], list[str]]:
    """The job's real discover_hosts.sh, run on this machine as the launcher runs it (its
    service account's token, the apiserver's address)."""
    cp = c.local.cp
    assert cp is not None
    cm = c.api.get("ConfigMap", ns, f"{name}-config")
    assert cm is not None
    d = tmp / f"disc-{ns}"
    (d / "sa").mkdir(parents=True, exist_ok=True)
    (d / "discover_hosts.sh").write_text(cm["data"]["discover_hosts.sh"])
    (d / "discover_hosts.sh").chmod(0o755)
    token = c.kubectl("create", "token", f"{name}-launcher", "-n", ns).stdout.strip()
    (d / "sa" / "token").write_text(token)
    shutil.copy(cp.ca, d / "sa" / "ca.crt")
    env = {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": cp.address,  # on real nodes, where pods reach it
        "KUBERNETES_SERVICE_PORT": str(cp.port),
        "ETOPERATOR_SA_DIR": str(d / "sa"),
        "TMPDIR": str(d),
    }

    def run() -> list[str]:
        out = subprocess.run(
            [str(d / "discover_hosts.sh")], capture_output=True, text=True, env=env, timeout=10
        )
        return [line.split(":")[0] for line in out.stdout.splitlines()]

    return run


def gone(name: str, listing: Callable[[], list[str]]) -> bool:
    """`name` is no longer listed, and the others still are (an empty list is a failure)."""
    hosts = listing()
    return bool(hosts) and name not in hosts


def p1_p2_p3(tmp: Path, rounds: int) -> list[Row]:
    """On real nodes, the operator deployed: a 3-worker job (workers with a real sshd, the
    launcher idle: the figures are the operator's), each worker's start and each host list
    change timed from watches."""
    c = start_chain(tmp / "chain")
    try:
        ns = c.new_namespace()
        c.create(on_real_nodes(job("b", replicas=3, maxReplicas=64)), ns)
        wait_for(lambda: c.phase(ns, "b") == "Running", 180, "the job Running")
        disc = discover(c, ns, "b", tmp)
        t0 = time.monotonic()
        # The first call starts the watcher, as at Horovod's start; a call that cannot reach
        # the apiserver prints no host, which would pass for every worker gone.
        assert len(disc()) == 3, "discovery cannot reach the apiserver"
        first = time.monotonic() - t0
        tl = Timeline(c, ns)
        p1 = [p1_round(c, ns, disc) for _ in range(rounds)]
        p2_raw: list[float] = []
        p2_net: list[float] = []
        p3_out: list[float] = []
        p3_del: list[float] = []
        for i in range(rounds):
            raw, net, out, deleted = p2_p3_round(c, ns, tl, i)
            p2_raw.append(raw)
            p2_net.append(net)
            p3_out.append(out)
            p3_del.append(deleted)
        reads, window = discovery_requests(c, ns, "b", disc, tmp / f"disc-{ns}" / "sa")
        return [
            ("P1", "worker failed (seen in the API) -> discover_hosts.sh stops listing it",
             f"{fmt(p1)} (rounds: {', '.join(f'{v:.2f}' for v in p1)})", "<= 1 s"),
            ("P1", "discover_hosts.sh's first call (starts the watcher)", f"{first:.2f}s", ""),
            ("P1", "discovery requests per running job per 10 min, steady (run each second)",
             f"{len(reads) * 600 / window:.1f} ({len(reads)} in {window:.0f} s)", "< 1"),
            ("P2", "ScaleOut -> new host listed (raw)", fmt(p2_raw), ""),
            ("P2", "ScaleOut -> listed, minus pod start (beyond the pod Running)", fmt(p2_net),
             "<= 2 s"),
            ("P3", "ScaleIn -> victim out of the list", fmt(p3_out), "<= 1 s"),
            ("P3", "out of the list -> drained (sshd asked) -> pod deleted", fmt(p3_del),
             "<= 3 s"),
        ]  # fmt: skip
    finally:
        c.stop()


def p1_round(c: Chain, ns: str, disc: Callable[[], list[str]]) -> float:
    """A listed worker's containers killed: from the API showing it Failed until discovery
    drops it; then the job is scaled back to 3 workers."""
    victim = c.hosts(ns, "b")[0]
    c.kill(ns, victim)
    seen = wait_for(partial(in_phase, c, ns, [victim], "Failed"), 60, "the victim Failed", 0.01)
    wait_for(partial(gone, victim, disc), 30, "discovery to drop it", 0.01)
    took = time.monotonic() - seen
    wait_for(lambda: c.job(ns, "b")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 2, 30)
    c.kubectl("scale", "trainingjob", "b", "-n", ns, "--replicas", "3")
    wait_for(lambda: len(c.hosts(ns, "b")) == 3, 120, "3 hosts again")
    return took


def p2_p3_round(c: Chain, ns: str, tl: Timeline, i: int) -> tuple[float, float, float, float]:
    """A ScaleOut +1, then a ScaleIn of the new worker by name: (ScaleOut -> listed, pod
    Running -> listed, ScaleIn -> unlisted, unlisted -> pod deleted)."""
    grow, shrink = f"so-{i}", f"si-{i}"
    t0 = time.monotonic()
    c.create(scaleout(grow, "b", 1), ns)
    wait_for(partial(tl.seen, ("ScaleSucceeded", grow)), 60, "ScaleSucceeded")
    (name,) = c.status(ns, grow, "ScaleOut").get("addPods") or [""]
    wait_for(partial(tl.seen, ("listed", name), ("running", name)), 10, "seen listed")
    raw, net = tl.at["listed", name] - t0, tl.at["listed", name] - tl.at["running", name]
    t0 = time.monotonic()
    c.create(scalein(shrink, "b", pod_names=[name]), ns)
    wait_for(partial(tl.seen, ("unlisted", name), ("deleted", name)), 60, "unlisted, deleted")
    return raw, net, tl.at["unlisted", name] - t0, tl.at["deleted", name] - tl.at["unlisted", name]


def discovery_requests(
    c: World, ns: str, name: str, disc: Callable[[], list[str]], sa: Path
) -> tuple[list[str], float]:
    """Discovery's cost once steady: the script run once a second for DISCOVERY_WINDOW, as
    Horovod runs it; the job's launcher account's requests in that window (the audit log)."""
    cp = c.local.cp
    assert cp is not None
    start = time.time()
    while time.time() < start + DISCOVERY_WINDOW:
        disc()
        time.sleep(1)
    end = time.time()
    marker = f"{cp.url}/api/v1/namespaces/{ns}/configmaps/{naming.config_map_name(name)}?marker=1"
    auth = f"Authorization: Bearer {(sa / 'token').read_text()}"
    subprocess.run(["curl", "-sf", "--cacert", str(sa / "ca.crt"), "-H", auth, marker],
                   check=True, capture_output=True)  # fmt: skip
    # The audit log is written in batches: once the marker is in it, so is the window.
    wait_for(lambda: any("marker=1" in str(e.get("requestURI")) for e in cp.audit()), 10)
    user = f"system:serviceaccount:{ns}:{naming.launcher_sa_name(name)}"
    return operator_requests(c, start, end, user), end - start


def buckets_of(text: str, name: str, labels: str = "") -> list[tuple[float, float]]:
    """A histogram's cumulative buckets, of the series whose labels include `labels`
    (`step="plan"`)."""
    found = []
    for m in re.finditer(rf"^{name}_bucket{{([^}}]*)}} ([0-9.e+]+)$", text, re.M):
        series = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
        le = series.pop("le")
        if labels and labels not in m[1]:
            continue
        found.append((float("inf") if le == "+Inf" else float(le), float(m[2])))
    return found


def histogram_quantile(text: str, name: str, q: float, since: str = "", labels: str = "") -> float:
    """The bucket holding quantile q (of the observations after `since`, when given)."""
    before = dict(buckets_of(since, name, labels)) if since else {}
    buckets = [(le, n - before.get(le, 0.0)) for le, n in buckets_of(text, name, labels)]
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def over(metrics: str, step: str, limit: float = 0.5) -> int:
    """How many times a step of a pass took longer than `limit` (one of its bucket bounds)."""
    buckets = dict(buckets_of(metrics, STEPS, step_label(step)))
    return int(buckets[float("inf")] - buckets[limit])


def step_p99(metrics: str, step: str) -> float:
    return histogram_quantile(metrics, STEPS, 0.99, labels=step_label(step))


def at(stamp: object) -> float:
    """An audit log timestamp in seconds since the epoch."""
    return datetime.fromisoformat(str(stamp)).timestamp()


def operator_requests(c: World, start: float, end: float, user: str = OPERATOR_USER) -> list[str]:
    """The verbs of the operator's (or `user`'s) requests received between two times (the
    audit log)."""
    assert c.local.cp is not None
    got: dict[str, str] = {}  # one entry a request (a watch is logged at two stages)
    for ev in c.local.cp.audit():
        if (ev.get("user") or {}).get("username") != user:
            continue
        if start <= at(ev["requestReceivedTimestamp"]) < end:
            got[str(ev["auditID"])] = str(ev["verb"])
    return list(got.values())


def operator_write_events(c: Hollow, start: float, end: float) -> list[dict[str, Any]]:
    """The audit log's events of the operator's writes received between two times (a write is
    logged once, when its response is complete)."""
    return [
        ev
        for ev in c.cp.audit()
        if (ev.get("user") or {}).get("username") == OPERATOR_USER
        and ev["verb"] not in READS
        and start <= at(ev["requestReceivedTimestamp"]) < end
    ]


def operator_writes(events: list[dict[str, Any]]) -> Counter[str]:
    """The operator's writes by verb and resource, and the refused ones by their code."""
    got: dict[str, str] = {}
    for ev in events:
        ref = ev.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        code = int((ev.get("responseStatus") or {}).get("code") or 0)
        refused = f" ({code})" if code >= 300 else ""  # e.g. 409: already there
        got[str(ev["auditID"])] = f"{ev['verb']} {ref.get('resource', '?')}{sub}{refused}"
    return Counter(got.values())


READS = frozenset({"get", "list", "watch"})


def server_seconds(events: list[dict[str, Any]]) -> dict[str, list[float]]:
    """How long the apiserver itself took over each of the operator's writes, by verb and by
    verb and resource (received -> response complete), and how much of that was its wait in
    the apiserver's priority-and-fairness queue ("apf")."""
    got: dict[str, list[float]] = {}
    for ev in events:
        if ev.get("stage") != "ResponseComplete":
            continue
        took = at(ev["stageTimestamp"]) - at(ev["requestReceivedTimestamp"])
        resource = (ev.get("objectRef") or {}).get("resource", "?")
        got.setdefault(str(ev["verb"]), []).append(took)
        got.setdefault(f"{ev['verb']} {resource}", []).append(took)
        wait = (ev.get("annotations") or {}).get("apiserver.latency.k8s.io/apf-queue-wait")
        if wait:
            got.setdefault("apf", []).append(_duration(wait))
    return got


def _duration(text: str) -> float:
    """A Go duration ("1.5s", "120ms", "3.2µs") in seconds."""
    for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def cpu_seconds(pids: list[int]) -> float:
    """CPU (user + system) the processes have used so far."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_by_part(c: Hollow) -> dict[str, float]:
    """CPU seconds of each part of a hollow cluster: who takes the machine's cores."""
    assert c.operator.proc is not None and c.local.hollow_nodes is not None
    parts = {name: [p.pid] for name, p in c.cp.procs.items()}
    parts["kubemark"] = [p.pid for p in c.local.hollow_nodes.procs]
    parts["operator"] = [c.operator.proc.pid]
    return {name: cpu_seconds(pids) for name, pids in parts.items()}


def scrape(c: Hollow) -> str:
    url = f"http://127.0.0.1:{c.operator.metrics_port}/metrics"
    return subprocess.run(["curl", "-s", url], capture_output=True, text=True).stdout


def rss_mib(proc: subprocess.Popen[bytes] | None) -> int:
    assert proc is not None
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


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


def step_label(step: str) -> str:
    return f'step="{step}"'


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
    from localcluster.cluster import OperatorProcess

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


def admitted_at(c: World, ns: str) -> Callable[[], dict[str, float]]:
    """When each job's Workload was first seen Admitted (a watch, as any client sees it)."""
    import threading

    from kubernetes import client, watch

    seen: dict[str, float] = {}
    api = client.CustomObjectsApi(c.api.api)

    def run() -> None:
        while True:
            try:
                for ev in watch.Watch().stream(
                    api.list_namespaced_custom_object,
                    "kueue.x-k8s.io",
                    "v1beta2",
                    ns,
                    "workloads",
                    timeout_seconds=300,
                ):
                    body = ev["object"]
                    conds = (body.get("status") or {}).get("conditions") or []
                    if any(x["type"] == "Admitted" and x["status"] == "True" for x in conds):
                        job = body["metadata"]["labels"].get(naming.LABEL_JOB, "")
                        seen.setdefault(job, time.monotonic())
            except Exception:  # a watch that ends is opened again
                time.sleep(0.1)

    threading.Thread(target=run, daemon=True).start()
    return lambda: dict(seen)


Q1_CPU = 10  # millicores a pod asks for: hollow nodes have room for 100 pods of it each


def q1(tmp: Path, rounds: int = 10, queued: int = 100, room: int = 10) -> list[Row]:
    """Shared clusters (Kueue on hollow nodes): admitted -> first worker created and -> job
    Running; a ScaleIn's end -> a waiting job admitted; `queued` jobs on quota for `room`."""
    from tests.support.queues import make_queue, queued_job, workloads

    c = start_hollow(tmp, 2, HOLLOW_PODS, ["--no-ssh-checks"], kueue=True)
    try:
        ns = c.new_namespace()
        make_queue(c, ns, pods=room * 3, millicpu=Q1_CPU)
        tl, admitted = Timeline(c, ns), admitted_at(c, ns)
        to_worker, to_running = [], []
        for i in range(rounds):
            name = f"a{i}"
            c.create(queued_job(name, replicas=2, millicpu=Q1_CPU), ns)
            wait_for(lambda: c.phase(ns, name) == "Running", 60, interval=0.02)  # noqa: B023
            done = time.monotonic()
            at = admitted()[name]
            to_worker.append(tl.at[("created", f"{name}-worker-0")] - at)
            to_running.append(done - at)
            c.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
        wait_for(lambda: workloads(c, ns) == [], 60, "their Workloads collected")
        freed = q1_scale_in(c, ns, tl, admitted, rounds=5, room=room)
        flow = q1_flow(c, ns, admitted, queued, room)
        return [
            ("Q1", "Workload admitted -> first worker created p50 / p95",
             f"{fmt(to_worker)}", "<= 1 s"),
            ("Q1", "Workload admitted -> job Running p50 / p95", f"{fmt(to_running)}", "<= 3 s"),
            ("Q1", "ScaleIn's victim deleted -> a waiting job admitted p50 / p95",
             f"{fmt(freed)}", "<= 2 s"),
            *flow,
        ]  # fmt: skip
    finally:
        c.stop()


def q1_scale_in(
    c: Hollow, ns: str, tl: Timeline, admitted: Callable[[], dict[str, float]], rounds: int,
    room: int,
) -> list[float]:  # fmt: skip
    """A job holding all the room but one worker's, another waiting for two: a ScaleIn of the
    first by one lets the second in; from the ScaleIn's end to that admission."""
    from tests.support.queues import queued_job, workloads

    took = []
    n = room * 3 - 2  # big's workers: with its launcher, all the room but one pod's
    for i in range(rounds):
        big, small, less = f"big{i}", f"small{i}", f"less{i}"
        c.create(queued_job(big, replicas=n, minReplicas=n - 1, maxReplicas=n, millicpu=Q1_CPU), ns)
        wait_for(lambda: len(c.hosts(ns, big)) == n, 120, f"{big} running")  # noqa: B023
        c.create(queued_job(small, replicas=1, millicpu=Q1_CPU), ns)  # launcher + 1 worker
        wait_for(lambda: c.phase(ns, small) == "Queued", 30, f"{small} queued")  # noqa: B023
        # Nothing runs in a hollow pod to drain: the victim goes at the 1 s timeout.
        c.create(scalein(less, big, count=1, timeout=1), ns)
        wait_for(lambda: small in admitted(), 60, f"{small} admitted")  # noqa: B023
        pods = wait_for(lambda: c.status(ns, less, "ScaleIn").get("toDeletePods") or [])  # noqa: B023
        victim = str(pods[0])
        wait_for(lambda: tl.seen(("deleted", victim)), 30, f"{victim} deleted")  # noqa: B023
        took.append(admitted()[small] - tl.at[("deleted", victim)])
        c.kubectl("delete", "tj", big, small, "-n", ns, "--wait=true")
        wait_for(lambda: workloads(c, ns) == [], 60, "their Workloads collected")
    return took


def q1_flow(
    c: Hollow, ns: str, admitted: Callable[[], dict[str, float]], jobs: int, room: int
) -> list[Row]:
    """`jobs` queued at once on quota for `room`: each deleted once Running (hollow pods never
    end), which lets the next in. Admissions a minute, the last one's wait, the operator's RSS
    and requests."""
    from tests.support.queues import queued_job

    t0, wall0 = time.monotonic(), time.time()
    for i in range(jobs):
        c.create(queued_job(f"f{i}", replicas=2, millicpu=Q1_CPU), ns)
    created = time.monotonic()
    left, rss = set(range(jobs)), 0
    deadline = time.monotonic() + 900
    while left and time.monotonic() < deadline:
        jobs_now = {j["metadata"]["name"]: (j.get("status") or {}).get("phase")
                    for j in c.api.list(naming.JOB_KIND, ns)}  # fmt: skip
        for i in sorted(left):
            if jobs_now.get(f"f{i}") == "Running":
                c.kubectl("delete", "tj", f"f{i}", "-n", ns, "--wait=false")
                left.discard(i)
        rss = max(rss, rss_mib(c.operator.proc))
        time.sleep(0.2)
    took = time.monotonic() - t0
    seen = admitted()
    last = max((seen[f"f{i}"] for i in range(jobs) if f"f{i}" in seen), default=t0) - created
    requests = operator_requests(c, wall0, time.time())
    return [
        ("Q1", f"{jobs} queued on quota for {room}: admissions a minute",
         f"{60 * len([i for i in range(jobs) if f'f{i}' in seen]) / took:.0f}", ">= 100"),
        ("Q1", "... the last one admitted after", f"{last:.1f}s", ""),
        ("Q1", "... operator RSS max / requests a minute",
         f"{rss} MiB / {60 * len(requests) / took:.0f}", "<= 300 MiB"),
        ("Q1", "... jobs never admitted", str(len(left)), "0"),
    ]  # fmt: skip


def g1(tmp: Path, rounds: int = 10, workers: int = 8) -> list[Row]:
    """Gang scheduling (hollow nodes, kube-scheduler's GangScheduling plugin): job created ->
    every worker bound, with and without the gang; a waiting gang -> bound once room frees."""
    c = hollow(tmp, 2 * workers * 4)
    try:
        ns = c.new_namespace()
        tl = Timeline(c, ns)
        took: dict[str, list[float]] = {"plain": [], "gang": []}
        for i in range(rounds):
            for kind in took:
                name = f"{kind}{i}"
                body = job(name, replicas=workers)
                if kind == "gang":
                    body["spec"]["schedulingPolicy"] = {"minAvailable": workers}
                t0 = time.monotonic()
                c.create(body, ns)
                names = [f"{name}-worker-{k}" for k in range(workers)]
                wait_for(lambda: tl.seen(*(("bound", n) for n in names)), 60, f"{name} bound")  # noqa: B023
                took[kind].append(max(tl.at[("bound", n)] for n in names) - t0)
                c.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
        try:
            waited = fmt(g1_waiting(c, ns, tl))
        except AssertionError as exc:  # said as the figure: the first part still counts
            waited = f"failed: {str(exc)[:60]}"
        return [
            ("G1", f"job of {workers} created -> every worker bound, no gang p50 / p95",
             fmt(took["plain"]), ""),
            ("G1", "... with the gang (all or nothing) p50 / p95", fmt(took["gang"]),
             "within 1 s of no gang"),
            ("G1", "a waiting gang: room freed (the other job deleted) -> every worker bound",
             waited, "<= 5 s"),
        ]  # fmt: skip
    finally:
        c.stop()


def g1_waiting(c: Hollow, ns: str, tl: Timeline, rounds: int = 3) -> list[float]:
    """Two gangs of two workers, each worker 40% of a node's CPU, on one node: the first placed
    whole, the second made then and waiting (no worker bound) until the first is deleted. (Made
    together, either may be the one placed: the scheduler takes the gangs in its own order.)"""
    node = c.nodes()[0]
    cpu = c.kubectl("get", "node", node, "-o", "jsonpath={.status.allocatable.cpu}").stdout
    milli = int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000
    took = []
    for i in range(rounds):
        first, second = f"first{i}", f"second{i}"
        for name in (first, second):
            body = job(name, replicas=2)
            body["spec"]["schedulingPolicy"] = {"minAvailable": 2}
            pod = body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
            pod["containers"][0]["resources"] = {"requests": {"cpu": f"{milli * 2 // 5}m"}}
            pod["nodeSelector"] = {"kubernetes.io/hostname": node}
            c.create(body, ns)
            workers = [f"{name}-worker-{k}" for k in range(2)]
            if name == first:
                wait_for(lambda: tl.seen(*(("bound", n) for n in workers)), 60, "the first gang")  # noqa: B023
        wait_for(lambda: c.condition(ns, second, "GangPending"), 60, "the second waiting")  # noqa: B023
        assert not any(tl.seen(("bound", n)) for n in workers), "a part of a gang was placed"
        t0 = time.monotonic()
        c.kubectl("delete", "tj", first, "-n", ns, "--wait=false")
        wait_for(lambda: tl.seen(*(("bound", n) for n in workers)), 120, "the second gang")  # noqa: B023
        took.append(max(tl.at[("bound", n)] for n in workers) - t0)
        c.kubectl("delete", "tj", second, "-n", ns, "--wait=true")
        wait_for(lambda: not c.pods(ns, first), 60, "the first gang's pods gone")  # noqa: B023
    return took


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
        ("A1", "... elastic (ScaleOut +2, ScaleIn by count and by name, a worker killed)",
         f"{resized.accuracy} ({diff * 100:+.1f} points)", "within 1 point"),
    ]  # fmt: skip


def p10(tmp: Path, rounds: int = 20) -> list[Row]:
    """The operator's own latency on real nodes, against the Go operator's medians measured on
    this machine kind (it checks nothing: no sshd probe, no name or bound checks): a job's
    launcher created after its workers run, and a ScaleOut's new host listed and succeeded
    after its pod runs. Polled every 50 ms through the API (a pod's Running is when the kubelet
    reported its container started: sshd's own start comes after)."""
    c = start_chain(tmp / "chain")
    figures: list[tuple[float, float, float]] = []
    try:
        ns = c.new_namespace()
        for i in range(rounds):
            figures.append(p10_round(c, ns, f"p10-{i}"))
            c.kubectl("delete", "tj", f"p10-{i}", "-n", ns, "--wait=false")
    finally:
        c.stop()
    launch, listed, done = (list(v) for v in zip(*figures, strict=True))

    def p50_p95(v: list[float]) -> str:
        return f"p50 {pct(v, 0.5):.2f}s, p95 {pct(v, 0.95):.2f}s ({len(v)} rounds)"

    return [
        ("P10", "job created -> launcher created, beyond its workers Running", p50_p95(launch),
         "<= 1.5 s (Go operator 1.39 s from creation)"),
        ("P10", "ScaleOut -> new host listed, beyond its pod Running", p50_p95(listed),
         "<= 0.5 s (Go 0.41 s to succeeded)"),
        ("P10", "ScaleOut -> ScaleSucceeded, beyond its pod Running", p50_p95(done), "<= 1 s"),
    ]  # fmt: skip


def p10_round(c: Chain, ns: str, name: str) -> tuple[float, float, float]:
    """(launcher created, new host listed, ScaleOut succeeded), each in seconds beyond the
    pods the operator waited for being Running."""
    t0 = time.monotonic()
    c.create(on_real_nodes(job(name, replicas=2, maxReplicas=3)), ns)
    workers = [f"{name}-worker-{i}" for i in range(2)]
    up = wait_for(lambda: in_phase(c, ns, workers), 120, "workers Running", 0.05)
    wait_for(lambda: c.api.get("Pod", ns, f"{name}-launcher"), 60, "the launcher", 0.05)
    launch = time.monotonic() - max(t0, up)
    t1 = time.monotonic()
    c.create(scaleout(f"{name}-grow", name, 1), ns)
    new = f"{name}-worker-2"
    up = wait_for(lambda: in_phase(c, ns, [new]), 60, "the new worker Running", 0.05)
    wait_for(lambda: new in c.hosts(ns, name), 60, "the new host listed", 0.05)
    listed = time.monotonic() - max(t1, up)
    grow = f"{name}-grow"
    wait_for(lambda: c.phase(ns, grow, "ScaleOut") == "ScaleSucceeded", 60, "success", 0.05)
    return launch, listed, time.monotonic() - max(t1, up)


def ha(tmp: Path, rounds: int = 3) -> list[Row]:
    """The seams of the operator's HA, as deploy/ runs it (two replicas, leader election) on a
    real node: how long the Lease goes unheld when its holder's pod is deleted (graceful: it
    releases the Lease) or its processes are killed (the standby waits out the Lease), and how
    long a ScaleOut made 1 s after an apiserver restart takes beyond its new pod Running."""
    c = start_chain(tmp / "chain")
    graceful: list[float] = []
    killed: list[float] = []
    after_restart: list[float] = []
    try:
        ns = c.new_namespace()
        for i in range(rounds):
            graceful.append(
                hand_over(
                    c,
                    lambda pod: c.kubectl(
                        "delete", "pod", "-n", "etoperator-system", pod, "--wait=false"
                    ),
                )
            )
            killed.append(hand_over(c, lambda pod: c.local.kill_pod("etoperator-system", pod)))
            after_restart.append(scale_after_restart(c, ns, f"ha-{i}"))
    finally:
        c.stop()
    return [
        ("HA", "leader pod deleted -> the standby holds the Lease", fmt(graceful), "<= 3 s"),
        ("HA", "leader killed -> another replica holds the Lease", fmt(killed), "<= 15 s"),
        ("HA", "ScaleOut 1 s after an apiserver restart -> succeeded, beyond its pod Running",
         fmt(after_restart), "<= 2 s"),
    ]  # fmt: skip


def hand_over(c: Chain, stop: Callable[[str], object]) -> float:
    """Seconds from stopping the leader's pod (by `stop`) to a live replica renewing the Lease
    (a killed container comes back in the same pod, with the same identity: it may win)."""
    leader = wait_for(lambda: c.operator.leader(), 60, "a leader")
    wait_for(lambda: [p for p in operator_pods_ready(c) if p != leader], 120, "a standby ready")
    t0, stopped = time.monotonic(), datetime.now(UTC)
    stop(leader)
    wait_for(lambda: renewed_after(c, stopped), 60, "the Lease renewed", 0.05)
    return time.monotonic() - t0


def renewed_after(c: Chain, when: datetime) -> bool:
    lease = c.api.get("Lease", "etoperator-system", "etoperator") or {}
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    if not spec.get("holderIdentity") or not renewed:
        return False
    return datetime.fromisoformat(str(renewed).replace("Z", "+00:00")) > when


def operator_pods_ready(c: Chain) -> list[str]:
    out = c.kubectl(
        "get", "pods", "-n", "etoperator-system", "-l", "app.kubernetes.io/name=etoperator",
        "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="
        "'Ready')].status} {.metadata.deletionTimestamp}{'\\n'}{end}",
    ).stdout  # fmt: skip
    return [f[0] for f in (line.split() for line in out.splitlines()) if f[1:] == ["True"]]


def scale_after_restart(c: Chain, ns: str, name: str) -> float:
    c.create(on_real_nodes(job(name, replicas=1, maxReplicas=2)), ns)
    wait_for(lambda: c.phase(ns, name) == "Running", 120, "the job running")
    assert c.local.cp is not None
    c.local.cp.kill_apiserver()
    c.local.cp.start_apiserver()
    time.sleep(1)  # the figure's own gap: a scale made 1 s after the apiserver is back
    t1 = time.monotonic()
    c.create(scaleout(f"{name}-grow", name, 1), ns)
    new = f"{name}-worker-1"
    up = wait_for(lambda: in_phase(c, ns, [new]), 120, "the new worker Running", 0.05)
    grow = f"{name}-grow"
    wait_for(lambda: c.phase(ns, grow, "ScaleOut") == "ScaleSucceeded", 120, "success", 0.05)
    c.kubectl("delete", "tj", name, "-n", ns, "--wait=false")
    return time.monotonic() - max(t1, up)


def on_real_nodes(body: dict[str, Any]) -> dict[str, Any]:
    """A test job for real nodes: the training image, and a launcher that waits (the operator's
    latency, not training, is measured)."""
    specs = body["spec"]["etReplicaSpecs"]
    for role in ("launcher", "worker"):
        first = specs[role]["template"]["spec"]["containers"][0]
        first.update(image="etoperator/train:latest", imagePullPolicy="IfNotPresent")
    specs["launcher"]["template"]["spec"]["containers"][0]["command"] = ["sleep", "3600"]
    return body


def in_phase(c: World, ns: str, pods: list[str], phase: str = "Running") -> float:
    """Now, if every pod is in `phase` (0.0 while one is not)."""
    phases = [((c.api.get("Pod", ns, p) or {}).get("status") or {}).get("phase") for p in pods]
    return time.monotonic() if all(ph == phase for ph in phases) else 0.0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    order = ["p1", "p5", "p7", "p8", "p9", "p4", "kills", "p6", "a1", "p10", "ha", "q1", "g1"]
    p.add_argument("--only", nargs="*", default=order)
    p.add_argument("--minutes", type=float, default=5.0, help="P7's length")
    args = p.parse_args()
    rows: list[Row] = []
    stages: list[tuple[str, Callable[[Path], list[Row]]]] = [
        ("p1", lambda t: p1_p2_p3(t, args.rounds)),
        ("p5", lambda t: p5(t, args.jobs, args.workers)),
        ("p7", lambda t: p7(t, minutes=args.minutes)),
        ("p8", p8),
        ("p9", p9),
        ("p4", p4),
        ("kills", kills),
        ("p6", p6),
        ("a1", accuracy),
        ("p10", p10),
        ("ha", ha),
        ("q1", q1),
        ("g1", g1),
    ]
    with tempfile.TemporaryDirectory() as d:
        for name, stage in stages:
            if name not in args.only:
                continue
            (Path(d) / name).mkdir(parents=True, exist_ok=True)
            try:
                got = stage(Path(d) / name)
            except Exception as exc:  # a stage that fails is a row; the others still run
                got = [(name.upper(), "stage failed", type(exc).__name__, str(exc)[:60])]
            for row in got:  # print as they come: a later stage cannot lose them
                print("  ".join(row), flush=True)
            rows += got
    print(
        f"\nmachine: {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    )
    width = max(len(r[1]) for r in rows)
    print(f"{'id':4} {'measure':{width}} {'figure':36} goal")
    for r in rows:
        print(f"{r[0]:4} {r[1]:{width}} {r[2]:36} {r[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
