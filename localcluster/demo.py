"""`make demo`: a local elastic-training cluster on this machine, and a tour of what it does.

    python -m localcluster.demo            # up, the tour, then keep running
    python -m localcluster.demo --runtime Torchrun  # the tour of a Torchrun job instead
    python -m localcluster.demo --no-tour  # only bring the cluster up
    python -m localcluster.demo --down     # stop a demo running elsewhere

A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), a real
node (containerd, kubelet, kube-proxy; CoreDNS for cluster DNS) running the images built from
the shipped Dockerfiles, Kueue, and the operator installed with `kubectl apply -k deploy/`.
Ctrl-C stops every process it started, puts back what it changed on this machine, and removes
its directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from etoperator import kube
from localcluster import procs, torchtour
from localcluster.cluster import KubectlFailed, LocalCluster, clear_killed_runs
from localcluster.controlplane import binaries
from localcluster.torchlogs import Logbook
from localcluster.torchtour import TorchrunTour
from localcluster.tour import JOB, QueueTour, Tour, TourFailed
from localcluster.world import World

DEFAULT_DIR = Path("/tmp/etoperator-demo")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n")[0])
    p.add_argument("--no-tour", action="store_true", help="only bring the cluster up")
    p.add_argument("--exit", action="store_true", help="stop when the tour ends (no waiting)")
    p.add_argument("--down", action="store_true", help="stop a running demo")
    p.add_argument("--dir", type=Path, help=f"where its state lives (default {DEFAULT_DIR})")
    p.add_argument("--api-port", type=int, default=6443, help="the apiserver's port")
    p.add_argument("--results", type=Path, help="write the tour's timings here (JSON)")
    p.add_argument(
        "--runtime", choices=("Horovod", "Torchrun"), default="Horovod",
        help="the example job the tour runs: horovodrun's (examples/) or torchrun's "
        "(examples/torchrun/)",
    )  # fmt: skip
    return p


class Stages:
    """One progress line a stage, with how long it took."""

    def __init__(self) -> None:
        self.t0 = self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        print(f"[{now - self.t0:6.1f}s] {what} (+{now - self.last:.1f}s)", flush=True)
        self.last = now


def pid_file(d: Path) -> Path:
    return d / "demo.pid"


def running_pid(d: Path) -> int | None:
    try:
        pid = int(pid_file(d).read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def preflight(args: argparse.Namespace) -> list[str]:
    """What stands in the way, each as a sentence that says what to do."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "a real node needs root (network and mount namespaces, cgroups, containerd): "
            "run it as root"
        )
    for tool in ("unshare", "nsenter", "ip", "iptables", "buildah"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is missing: run `make setup`")
    pid = running_pid(args.dir)
    if pid is not None:
        problems.append(f"a demo is already running (pid {pid}): stop it with `make demo-down`")
    elif procs.port_in_use(args.api_port):
        problems.append(
            f"port {args.api_port} is in use (another cluster?): stop it, or pass "
            f"ARGS='--api-port N'"
        )
    return problems


def running_demos() -> list[int]:
    """Every demo running on this machine, wherever its state lives (`--dir`)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"localcluster.demo" in argv and b"--down" not in argv:
                found.append(int(proc.name))
    return found


def down(d: Path, explicit: bool) -> int:
    """Stop the demo of `d`; without an explicit --dir, any demo running here."""
    pid = running_pid(d)
    pids = [pid] if pid is not None else ([] if explicit else running_demos())
    if not pids:
        print(f"no demo is running (nothing in {d})" if explicit else "no demo is running")
        cleared = clear_killed_runs()
        if cleared:
            print(f"cleared what a killed cluster left here (slot {', '.join(map(str, cleared))})")
        return 0
    for p in pids:
        os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"stopped the demo (pid {', '.join(map(str, pids))})")
    return 0


def _alive(pid: int) -> bool:
    """Running: a process that has ended but is not reaped yet (a zombie, until whatever
    started it waits for it) is not, though signals still reach its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def tour(lc: LocalCluster, results: Path | None, runtime: str = "Horovod") -> None:
    def kubectl(
        *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            return lc.run_kubectl(*args, check=check, input=input)
        except KubectlFailed as exc:
            raise TourFailed(str(exc)) from None

    # What the tour polls, each poll a GET on one connection (a kubectl each was a process
    # and a discovery each, several a second).
    api = kube.Kube(kube.load_config(str(lc.kubeconfig)))

    def status(kind: str, name: str) -> dict[str, Any]:
        try:
            return dict((api.get(kind, "default", name, timeout=10) or {}).get("status") or {})
        except kube.ApiError:  # unanswered: the next poll asks again
            return {}

    if runtime == "Torchrun":
        book = Logbook(World(lc, lc.kubeconfig, api), "default", torchtour.JOB)
        try:
            timings = TorchrunTour(kubectl, book, lambda n: lc.kill_pod("default", n), status).run()
        finally:
            book.done.set()
    else:
        timings = Tour(
            kubectl=kubectl,
            launcher_log=lambda: lc.pod_log("default", f"{JOB}-launcher"),
            kill_worker=lambda name: lc.kill_pod("default", name),
            status=status,
            show=True,
        ).run()
    print("\nShared clusters: jobs queued and admitted by Kueue (examples/kueue/)", flush=True)
    timings |= QueueTour(kubectl=kubectl, status=status).run()
    if results is not None:
        results.write_text(json.dumps(timings, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    explicit = args.dir is not None
    args.dir = args.dir or DEFAULT_DIR
    if args.down:
        return down(args.dir, explicit)
    problems = preflight(args)
    if problems:
        for p in problems:
            print(f"demo: {p}", file=sys.stderr)
        return 2
    if args.dir.exists():
        print(f"cleaning up a stale demo in {args.dir}")
        shutil.rmtree(args.dir)
    args.dir.mkdir(parents=True)
    pid_file(args.dir).write_text(str(os.getpid()))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stage = Stages()
    bin_dir = binaries()
    stage(f"control-plane binaries ready in {bin_dir}")
    lc = LocalCluster(
        args.dir / "cluster",
        nodes=1,
        deploy=True,
        kueue=True,
        api_port=args.api_port,
        progress=stage,
    )
    try:
        return run(args, lc, stage, stop)
    finally:
        lc.stop()
        shutil.rmtree(args.dir, ignore_errors=True)
        print("demo stopped: every process it started has ended", flush=True)


def run(args: argparse.Namespace, lc: LocalCluster, stage: Stages, stop: threading.Event) -> int:
    lc.start()
    lc.wait_namespace_ready("default")
    stage("namespace default ready")
    assert lc.cp is not None
    if not args.no_tour:
        try:
            tour(lc, args.results, args.runtime)
        except TourFailed as exc:
            print(f"demo: the tour failed: {exc}", file=sys.stderr)
            return 1
        stage("tour done")
    if args.exit:  # --exit: the cluster stops now; nothing to tell of keeping it
        return 0
    print(
        f"\nThe cluster keeps running. In another shell:\n"
        f"  export KUBECONFIG={lc.kubeconfig}\n"
        f"  export PATH={lc.cp.bin}:$PATH\n"
        f"  kubectl get tj,so,si,pods\n"
        + ("" if not args.no_tour else "  kubectl create -f examples/training_job.yaml\n")
        + f"  kubectl create -f examples/scale_out.yaml\n"
        f"  kubectl logs -f {JOB}-launcher\n"
        f"Ctrl-C (or `make demo-down`) stops it.",
        flush=True,
    )
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
