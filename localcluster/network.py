"""The local cluster's network: a bridge on this machine that never leaves it.

Layout for cluster slot k (0-9, so that a demo and a test run can live side by side):
  - bridge `etok<k>` on this machine, 10.200.<k>.1/24: the control plane listens there and
    cluster DNS answers there;
  - node n (1-based) in a network namespace of its own, `etok<k>-n<n>`, reached over a veth pair
    whose node end is `eth0` with 10.200.<k>.<n+1>/24 (the kubelet refuses a loopback node IP);
  - pods of node n on that node's CNI bridge, 10.<210+k>.<n>.0/24, routed from this machine
    and from every other node through the node (so pods reach each other across nodes, and
    the operator, run here, reaches pod IPs as it would in a cluster).
Everything it adds on this machine hangs off the bridge and the veth pairs: deleting them (and
the namespaces) removes the routes with them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SLOTS = 10
NETNS_DIR = Path("/run/netns")
LOCKS = Path("/run/etoperator-slots")
# Set while /run/netns is a mount made by a local cluster's first `ip netns add` (on a machine
# that had none): the last cluster to go unmounts it, leaving the machine as it found it.
NETNS_OURS = LOCKS / "netns-mounted"


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """`ip ...` on this machine, or inside a network namespace (through nsenter, not `ip netns
    exec`, which remounts /sys)."""
    argv = ["ip", *args]
    if netns is not None:
        argv = ["nsenter", f"--net={NETNS_DIR / netns}", *argv]
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res.stdout


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (made if missing), waited for: clusters run side by side, in
    processes of their own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def machine_lock(name: str) -> contextlib.AbstractContextManager[None]:
    """One of this machine's locks among clusters: `netns` by whoever adds the first network
    namespace or removes the last; `slots` by whoever claims a slot or asks whether any is held
    (so that no cluster starts while the last one to stop puts back what they share)."""
    return locked(LOCKS / f"{name}.lock")


def netns_lock() -> contextlib.AbstractContextManager[None]:
    return machine_lock("netns")


def is_mount_point(path: Path) -> bool:
    """From mountinfo: /run/netns is bound onto itself, which os.path.ismount cannot tell."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def add_netns(name: str) -> None:
    with netns_lock():
        if not is_mount_point(NETNS_DIR):
            NETNS_OURS.write_text("" if NETNS_DIR.exists() else "created\n")
        ip("netns", "add", name)


def delete_netns(names: list[str]) -> None:
    """Delete the namespaces; once none is left, undo what the first `ip netns add` did."""
    with netns_lock():
        for name in names:
            ip("netns", "delete", name, check=False)
        if not NETNS_OURS.exists() or (NETNS_DIR.exists() and any(NETNS_DIR.iterdir())):
            return
        if is_mount_point(NETNS_DIR):
            subprocess.run(["umount", str(NETNS_DIR)], check=True)
        if NETNS_OURS.read_text() and NETNS_DIR.exists():
            NETNS_DIR.rmdir()
        NETNS_OURS.unlink()


def _try_slot(k: int) -> int | None:
    """The descriptor of slot k's lock if no running cluster holds it (now held by us)."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCKS / f"slot-{k}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def free_slots() -> Iterator[int]:
    """Each slot no running cluster holds, its lock held while the caller works on it (to clear
    what a killed run left there)."""
    for k in range(SLOTS):
        fd = _try_slot(k)
        if fd is None:
            continue
        try:
            yield k
        finally:
            os.close(fd)


def claim_slot() -> tuple[int, int]:
    """The first slot no running cluster holds, and the descriptor of its lock (held until this
    process ends, or closed). What a killed run left in the slot is the new owner's to clear."""
    with machine_lock("slots"):
        for k in range(SLOTS):
            fd = _try_slot(k)
            if fd is not None:
                return k, fd
    raise RuntimeError(f"all {SLOTS} local cluster slots are in use ({LOCKS})")


@dataclass(frozen=True)
class Network:
    slot: int

    @property
    def bridge(self) -> str:
        return f"etok{self.slot}"

    @property
    def gateway(self) -> str:
        """This machine's address on the bridge: the apiserver and cluster DNS listen here."""
        return f"10.200.{self.slot}.1"

    def node_ip(self, n: int) -> str:
        return f"10.200.{self.slot}.{n + 1}"

    def pod_cidr(self, n: int) -> str:
        return f"10.{210 + self.slot}.{n}.0/24"

    @property
    def cluster_cidr(self) -> str:
        return f"10.{210 + self.slot}.0.0/16"

    def netns(self, n: int) -> str:
        return f"{self.bridge}-n{n}"

    def create(self) -> Network:
        self.delete()  # what a killed run may have left in this slot
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        return self

    def add_node(self, n: int) -> str:
        """Node n's network namespace, wired to the bridge; returns its name."""
        ns, host_end = self.netns(n), f"{self.bridge}n{n}"
        add_netns(ns)
        ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", host_end, "master", self.bridge, "up")
        ip("addr", "add", f"{self.node_ip(n)}/24", "dev", "eth0", netns=ns)
        ip("link", "set", "lo", "up", netns=ns)
        ip("link", "set", "eth0", "up", netns=ns)
        ip("route", "add", "default", "via", self.gateway, netns=ns)
        ip("route", "add", self.pod_cidr(n), "via", self.node_ip(n))
        for other in self.nodes():  # node to node over the bridge, as a cluster's routes do
            if other != n:
                ip("route", "replace", self.pod_cidr(other), "via", self.node_ip(other), netns=ns)
                ip("route", "replace", self.pod_cidr(n), "via", self.node_ip(n),
                   netns=self.netns(other))  # fmt: skip
        # Forwarding between the node's pods and the bridge: a setting of the node's namespace.
        subprocess.run(
            ["nsenter", f"--net={NETNS_DIR / ns}", "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
        )
        return ns

    def nodes(self) -> list[int]:
        """The nodes whose namespaces exist in this slot."""
        prefix = f"{self.bridge}-n"
        found = sorted(NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.exists() else []
        return [int(p.name[len(prefix) :]) for p in found if p.name[len(prefix) :].isdigit()]

    def delete(self) -> bool:
        """The slot's veths, namespaces and bridge; whether there were any. A veth goes with
        its namespace only once the kernel has torn that down, later: it is deleted first."""
        links = Path("/sys/class/net")
        veths = sorted(links.glob(f"{self.bridge}n*"))
        for veth in veths:
            ip("link", "delete", veth.name, check=False)
        mine = sorted(NETNS_DIR.glob(f"{self.bridge}-n*")) if NETNS_DIR.exists() else []
        delete_netns([path.name for path in mine])
        bridge = (links / self.bridge).exists()
        if bridge:
            ip("link", "delete", self.bridge, check=False)
        return bool(veths or mine) or bridge
