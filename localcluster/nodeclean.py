"""What a node leaves on this machine, and its removal: its pods' network results, its
processes and cgroups, its mount namespaces (a killed run's too: `reclaim`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from localcluster.network import Network

CGROUP = Path("/sys/fs/cgroup")
NAMESPACES = Path("/run/etoperator-nodes")  # bind mounts that keep mount namespaces alive
KUBELET_ROOTS = Path("/var/lib/etoperator-nodes")


CNI_RESULTS = Path("/var/lib/cni/results")
CONTAINER_ID = re.compile(r"-([0-9a-f]{64})-")


def forget_cni_results(ids: set[str]) -> None:
    """containerd keeps each pod's network result in this machine's /var/lib/cni/results
    (the path is not configurable) until the pod's network is torn down, which pods killed
    with their node never are: those of the node's containers go with it."""
    if not ids or not CNI_RESULTS.is_dir():
        return
    for f in CNI_RESULTS.iterdir():
        m = CONTAINER_ID.search(f.name)
        if m and m[1] in ids:
            f.unlink(missing_ok=True)


def cni_network(slot: int) -> str:
    """The name of a slot's pod network: its pods' results in /var/lib/cni carry it."""
    return f"etoperator-{Network(slot).bridge}"


def forget_slot_cni_results(slot: int) -> bool:
    """The network results of a slot's pods (and their loopbacks'), whether its containerd
    stores are known or not; whether there were any."""
    if not CNI_RESULTS.is_dir():
        return False
    ours = re.compile(rf"^{cni_network(slot)}-([0-9a-f]{{64}})-")
    ids = {m[1] for f in CNI_RESULTS.iterdir() if (m := ours.match(f.name))}
    forget_cni_results(ids)
    return bool(ids)


def reclaim(slot: int) -> bool:
    """Everything of a slot's nodes that a killed run left: processes (pods, shims), mount
    namespaces, cgroups; whether there was any. (The network goes with Network.delete.)"""
    prefix = f"etoperator-etok{slot}-"
    roots = sorted((CGROUP / "pids").glob(prefix + "*"))
    for root in roots:
        kill_tree(root)
    anchors = sorted(NAMESPACES.glob(f"etok{slot}-n*.mnt")) if NAMESPACES.exists() else []
    for anchor in anchors:
        subprocess.run(["umount", str(anchor)], check=False, capture_output=True)
        anchor.unlink(missing_ok=True)
        shutil.rmtree(anchor.with_suffix(""), ignore_errors=True)
        shutil.rmtree(KUBELET_ROOTS / anchor.stem, ignore_errors=True)
    for controller in CGROUP.iterdir():
        for root in controller.glob(prefix + "*") if not controller.is_symlink() else []:
            remove_tree(root)
    return forget_slot_cni_results(slot) or bool(roots or anchors)


def tree_pids(base: Path) -> list[int]:
    """Every process in a cgroup tree. The tree changes as it is walked (a container's cgroup
    goes once its processes are gone): what vanished meanwhile is skipped."""
    pids: list[int] = []
    for d, _, files in os.walk(base):
        if "cgroup.procs" in files:
            with contextlib.suppress(FileNotFoundError):
                pids += [int(p) for p in (Path(d) / "cgroup.procs").read_text().split()]
    return pids


def kill_tree(base: Path) -> None:
    """SIGKILL every process under a pids cgroup until none is left."""
    for _ in range(50):
        pids = [pid for pid in tree_pids(base) if pid != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_tree(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=_depth, reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def _depth(p: Path) -> int:
    return len(p.parts)
