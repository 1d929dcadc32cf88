"""Benchmarks: `make bench` (or `python -m bench [--jobs N --workers M --quick]`).

Prints a table of figures against their goals. Not pass/fail: a figure that misses its goal is
printed as such. Uses the local cluster (the real control plane, the simulated kubelet with real
sshd workers, the operator as a real process under its deploy/ RBAC); P4 and P6 use the full
chain (real horovodrun training).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from etoperator.localcluster import procs
from etoperator.localcluster.cluster import OPERATOR_USER
from etoperator.localcluster.kubelet import Kubelet
from tests.harness import ROOT, Cluster, start_cluster, wait_for
from tests.integration.jobs import job, scalein, scaleout

Row = tuple[str, str, str, str]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}s, p95 {pct(values, 0.95):.2f}s"


def cluster(tmp: Path, ssh: bool = True, extra: list[str] | None = None) -> Cluster:
    return start_cluster(
        tmp, lambda cp: Kubelet(cp, tmp / "kubelet", ssh_port=2222, run_sshd=ssh), 2222, extra
    )


def discover(c: Cluster, ns: str, name: str, tmp: Path) -> Callable[[], list[str]]:
    """The job's real discover_hosts.sh, run as the launcher runs it."""
    cm = c.api.get("ConfigMap", ns, f"{name}-config")
    assert cm is not None
    d = tmp / f"disc-{ns}"
    (d / "sa").mkdir(parents=True, exist_ok=True)
    (d / "discover_hosts.sh").write_text(cm["data"]["discover_hosts.sh"])
    (d / "discover_hosts.sh").chmod(0o755)
    token = c.kubectl("create", "token", f"{name}-launcher", "-n", ns).stdout.strip()
    (d / "sa" / "token").write_text(token)
    shutil.copy(c.cp.ca, d / "sa" / "ca.crt")
    env = {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(c.cp.port),
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
    return name not in listing()


def added(before: set[str], listing: Callable[[], list[str]]) -> set[str]:
    return set(listing()) - before


def p1_p2_p3(tmp: Path, rounds: int) -> list[Row]:
    c = cluster(tmp)
    try:
        ns = c.new_namespace()
        c.create(job("b", replicas=3, maxReplicas=64, workerRestartPolicy="Always"), ns)
        wait_for(lambda: c.phase(ns, "b") == "Running", 60)
        disc = discover(c, ns, "b", tmp)
        hosts = partial(c.hosts, ns, "b")
        workers = partial(c.pods, ns, "b", "worker")
        p1: list[float] = []
        for _ in range(rounds):
            victim = c.hosts(ns, "b")[0]
            t0 = time.monotonic()
            c.kubelet.finish(ns, victim, 1)
            wait_for(partial(gone, victim, disc), 30, interval=0.01)
            p1.append(time.monotonic() - t0)
            wait_for(lambda: len(c.hosts(ns, "b")) == 3, 30)
        p2_raw: list[float] = []
        p2_net: list[float] = []
        p3_out: list[float] = []
        p3_del: list[float] = []
        for i in range(rounds):
            before = set(c.hosts(ns, "b"))
            t0 = time.monotonic()
            c.create(scaleout(f"so-{i}", "b", 1), ns)
            new = wait_for(partial(added, before, hosts), 30, interval=0.01)
            t_list = time.monotonic()
            (name,) = new
            pod = c.api.get("Pod", ns, name)
            started = c.kubelet.started_at.get((ns, name), t0)
            p2_raw.append(t_list - t0)
            p2_net.append(t_list - started)
            assert pod is not None
            t0 = time.monotonic()
            c.create(scalein(f"si-{i}", "b", pod_names=[name]), ns)
            wait_for(partial(gone, name, hosts), 30, interval=0.01)
            t_out = time.monotonic()
            p3_out.append(t_out - t0)
            wait_for(partial(gone, name, workers), 30, interval=0.01)
            p3_del.append(time.monotonic() - t_out)
        return [
            ("P1", "worker set change -> discover_hosts.sh prints it", fmt(p1), "<= 1 s"),
            ("P2", "ScaleOut -> new host listed (raw)", fmt(p2_raw), ""),
            ("P2", "ScaleOut -> listed, minus pod start", fmt(p2_net), "<= 2 s"),
            ("P3", "ScaleIn -> victim out of the list", fmt(p3_out), "<= 1 s"),
            ("P3", "drained -> victim pod deleted", fmt(p3_del), "<= 3 s"),
        ]
    finally:
        c.stop()


def histogram_quantile(text: str, name: str, q: float) -> float:
    buckets = []
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} ([0-9.e+]+)$', text, re.M):
        buckets.append((float("inf") if m[1] == "+Inf" else float(m[1]), float(m[2])))
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def operator_requests(c: Cluster, start: float, end: float) -> list[str]:
    """The verbs of the operator's requests received between two times (the audit log)."""
    from datetime import datetime

    got: dict[str, str] = {}  # one entry a request (a watch is logged at two stages)
    for ev in c.cp.audit():
        if (ev.get("user") or {}).get("username") != OPERATOR_USER:
            continue
        at = datetime.fromisoformat(str(ev["requestReceivedTimestamp"])).timestamp()
        if start <= at < end:
            got[str(ev["auditID"])] = str(ev["verb"])
    return list(got.values())


def p5(tmp: Path, jobs: int, workers: int) -> list[Row]:
    # The control plane alone: no sshd per worker (ssh checks off), so the figures are the
    # operator's own cost at this scale.
    c = cluster(tmp, ssh=False, extra=["--no-ssh-checks"])
    try:
        ns = c.new_namespace()
        t0 = time.monotonic()
        for i in range(jobs):
            c.create(job(f"j{i}", replicas=workers), ns)
        wait_for(
            lambda: all(c.phase(ns, f"j{i}") == "Running" for i in range(jobs)),
            600,
            "all jobs Running",
            interval=1,
        )
        settle = time.monotonic() - t0
        time.sleep(5)  # let the last status writes land before counting
        window = 60.0
        start = time.time()
        time.sleep(window)
        verbs = operator_requests(c, start, start + window)
        writes = sum(1 for v in verbs if v in ("create", "update", "patch", "delete"))
        total = len(verbs)
        metrics = subprocess.run(
            ["curl", "-s", f"http://127.0.0.1:{c.operator.metrics_port}/metrics"],
            capture_output=True,
            text=True,
        ).stdout
        p50 = histogram_quantile(metrics, "etoperator_reconcile_duration_seconds", 0.5)
        p99 = histogram_quantile(metrics, "etoperator_reconcile_duration_seconds", 0.99)
        assert c.operator.proc is not None
        rss = 0
        for line in Path(f"/proc/{c.operator.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
        return [
            ("P5", f"{jobs} jobs x {workers} workers: all Running after", f"{settle:.1f}s", ""),
            (
                "P5",
                "reconcile pass p50 / p99 (histogram bucket)",
                f"<= {p50}s / <= {p99}s",
                "p99 <= 1 s",
            ),
            ("P5", "operator RSS", f"{rss} MiB", "<= 200 MiB"),
            (
                "P5",
                "API requests per minute, steady",
                f"{total * 60 / window:.0f} ({writes} writes)",
                "no periodic writes",
            ),
        ]
    finally:
        c.stop()


def p4_p6(tmp: Path) -> list[Row]:
    """The tour of `make demo` (full chain: real horovodrun), non-interactive, timed."""
    results = tmp / "tour.json"
    log = tmp / "demo.log"
    with open(log, "w") as out:
        code = subprocess.run(
            [
                sys.executable, "-m", "etoperator.localcluster.demo", "--exit",
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
    rows.append(
        (
            "P6",
            "operator, 2 workers (before any scaling)",
            f"{t['steps_per_s_at_2']:.2f} steps/s",
            "",
        )
    )
    return rows


def p6(tmp: Path, steps: int = 200) -> list[Row]:
    """The example script at 2 workers, plain horovodrun with a static local host list."""
    venv = Path(sys.executable).parent
    cmd = [
        str(venv / "horovodrun"),
        "-np",
        "2",
        "-H",
        "localhost:2",
        sys.executable,
        str(ROOT / "examples/elastic_train.py"),
        "--steps",
        str(steps),
        "--step-sleep",
        "0.1",
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"},
    )
    times = [float(t) for t in re.findall(r"STEP \d+ size=2 loss=[\d.]+ t=([\d.]+)", out.stdout)]
    plain = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 10 else float("nan")
    return [("P6", "plain horovodrun, 2 local workers", f"{plain:.2f} steps/s", "")]


def ratio_row(rows: list[Row]) -> list[Row]:
    ours = [r for r in rows if r[1].startswith("operator, 2 workers")]
    plain = [r for r in rows if r[1].startswith("plain horovodrun")]
    if not ours or not plain:
        return []
    ratio = float(ours[0][2].split()[0]) / float(plain[0][2].split()[0])
    return [("P6", "steps/s under the operator / plain horovodrun", f"{ratio:.3f}", ">= 0.97")]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--only", nargs="*", default=["p1", "p5", "p4", "p6"])
    args = p.parse_args()
    rows: list[Row] = []
    stages: list[tuple[str, Callable[[Path], list[Row]]]] = [
        ("p1", lambda t: p1_p2_p3(t, args.rounds)),
        ("p5", lambda t: p5(t, args.jobs, args.workers)),
        ("p4", p4_p6),
        ("p6", p6),
    ]
    with tempfile.TemporaryDirectory() as d:
        for name, stage in stages:
            if name not in args.only:
                continue
            (Path(d) / name).mkdir(parents=True, exist_ok=True)
            try:
                got = stage(Path(d) / name)
            except (AssertionError, subprocess.CalledProcessError, OSError) as exc:
                got = [(name.upper(), "stage failed", type(exc).__name__, str(exc)[:60])]
            for row in got:  # print as they come: a later stage cannot lose them
                print("  ".join(row), flush=True)
            rows += got
        rows += ratio_row(rows)
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
