"""What the figures share: percentiles, the table's rows, hollow clusters, a Timeline of what
the apiserver shows, and readings of the audit log, metrics and process CPU."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from etoperator import naming
from localcluster import procs
from localcluster.cluster import OPERATOR_USER
from localcluster.world import (
    Hollow,
    World,
    start_hollow,
)

Row = tuple[str, str, str, str]


STEPS = "etoperator_pass_step_seconds"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}s, p95 {pct(values, 0.95):.2f}s"


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
            *((custom.list_namespaced_custom_object, (naming.GROUP, naming.VERSION, ns, plural),
               self._scaler) for plural in ("scaleouts", "scaleins")),
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


def step_label(step: str) -> str:
    return f'step="{step}"'


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


def rss_mib(proc: procs.Process | None) -> int:
    assert proc is not None
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


Q1_CPU = 10  # millicores a pod asks for: hollow nodes have room for 100 pods of it each


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
