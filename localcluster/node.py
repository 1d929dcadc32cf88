"""A real node on this machine: containerd + runc + the CNI bridge, the kubelet and kube-proxy,
in a network namespace and a mount namespace of their own (network.py has the addresses).

What stays off this machine: the node's interfaces, routes and iptables rules (its network
namespace), and every mount it makes (its mount namespace, a slave of this machine's, so it
still sees our files). What cannot stay off, and is put back at stop: the kernel sysctls the
kubelet sets with no opt-out (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory) and its
cgroups (cgroupfs, under a root of this node's own name).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from localcluster import procs
from localcluster.controlplane import ControlPlane
from localcluster.network import LOCKS, NETNS_DIR, Network
from localcluster.nodeclean import (
    CGROUP,
    KUBELET_ROOTS,
    NAMESPACES,
    forget_cni_results,
    kill_tree,
    remove_tree,
    tree_pids,
)
from localcluster.nodeconfig import cni_config, containerd_config, kube_proxy_config, kubelet_config
from localcluster.nodestore import (
    IMPORTED,
    image_name,
    import_turn,
    imported_archives,
    refresh_seed,
    seed_store,
)

GLOBAL_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory")
SAVED_SYSCTLS = LOCKS / "sysctls.json"  # this machine's values while any local node runs


def _read_sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text().strip() for k in GLOBAL_SYSCTLS}


def save_sysctls() -> None:
    """This machine's values, kept once for all local clusters (their kubelets all set the same
    values): by the first cluster to start, before its kubelet changes them."""
    if not SAVED_SYSCTLS.exists():
        SAVED_SYSCTLS.parent.mkdir(parents=True, exist_ok=True)
        tmp = SAVED_SYSCTLS.with_suffix(".tmp")
        tmp.write_text(json.dumps(_read_sysctls()))
        tmp.replace(SAVED_SYSCTLS)


def restore_sysctls() -> None:
    """Put back the values kept by save_sysctls (call when the last cluster has stopped)."""
    if not SAVED_SYSCTLS.exists():
        return
    for k, v in json.loads(SAVED_SYSCTLS.read_text()).items():
        path = Path("/proc/sys") / k
        if path.read_text().strip() != v:
            path.write_text(v)
    SAVED_SYSCTLS.unlink()


def release_namespaces_dir() -> None:
    """Once no node's mount namespace is anchored there, the private bind mount goes too."""
    if NAMESPACES.exists() and not any(NAMESPACES.glob("*.mnt")):
        subprocess.run(["umount", str(NAMESPACES)], check=False, capture_output=True)
        shutil.rmtree(NAMESPACES, ignore_errors=True)


def _private_dir(path: Path) -> None:
    """A directory that is a private mount of its own: the mount namespaces' anchor files live
    there (a namespace cannot be bind-mounted where mounts propagate)."""
    path.mkdir(parents=True, exist_ok=True)
    mounts = Path("/proc/self/mountinfo").read_text()
    if f" {path} " not in mounts:
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        subprocess.run(["mount", "--make-private", str(path)], check=True)


# Per log file, the bytes read so far and a record split over reads (CRI's "P" parts).
LogsRead = dict[str, tuple[int, str]]


def runs(path: Path) -> tuple[str, int, str]:
    """A container's log files (`name/RESTARTS.log`) in the order of its runs: 2 before 10."""
    return path.parent.name, len(path.stem), path.stem


@dataclass
class NodeBins:
    """Where the binaries are: the Kubernetes ones and the node's own (hack/build-node.sh)."""

    kube: Path
    node: Path

    @property
    def cni(self) -> Path:
        return self.node / "cni"


@dataclass
class RealNode:
    name: str
    n: int  # 1-based index on the network
    net: Network
    cp: ControlPlane
    bins: NodeBins
    dir: Path
    dns: str  # cluster DNS address
    images: list[Path] = field(default_factory=list)  # docker-archives to import
    # containerd's image store, kept from run to run: importing the training image (6 GB,
    # stored and unpacked) takes minutes, so it is done once per image content.
    store: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _mnt: Path | None = None

    @property
    def ip(self) -> str:
        return self.net.node_ip(self.n)

    @property
    def cgroup_root(self) -> str:
        return f"etoperator-{self.net.bridge}-{self.name}"

    @property
    def run_dir(self) -> Path:
        """containerd's sockets and state: a short path (a unix socket's is at most 104
        bytes), on tmpfs, one per slot and node."""
        return NAMESPACES / self.net.netns(self.n)

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's root (pod volumes, its own sockets): a short path on disk."""
        return KUBELET_ROOTS / self.net.netns(self.n)

    @property
    def sock(self) -> Path:
        return self.run_dir / "containerd.sock"

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> RealNode:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cgroups()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        netns = self.net.add_node(self.n)
        self._mnt = self._mount_namespace()
        self._enter = [
            "nsenter", f"--net={NETNS_DIR / netns}", f"--mount={self._mnt}", "--",
        ]  # fmt: skip
        with import_turn(self.store, self.images):
            seed_store(self.store, self.images)
            self._containerd()
            self._clear_leftovers()
            if self._import_images():
                assert self.store is not None  # an import into a kept store only
                refresh_seed(self.store, self.store_root)
        self._kubelet()
        self._kube_proxy()
        return self

    def _mount_namespace(self) -> Path:
        _private_dir(NAMESPACES)
        anchor = NAMESPACES / f"{self.net.netns(self.n)}.mnt"
        anchor.touch()
        subprocess.run(
            ["unshare", f"--mount={anchor}", "--propagation", "slave", "true"], check=True
        )
        return anchor

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """A daemon of the node, in the node's namespaces and in the `daemons` group of its pids
        cgroup, so that containerd's shims (which outlive it) are found and ended with it."""
        path = f"{self.bins.node}:{self.bins.kube}:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
        full_env = {"PATH": path, "HOME": str(self.dir), **(env or {})}
        tasks = CGROUP / "pids" / self.cgroup_root / "daemons" / "cgroup.procs"
        join = ["sh", "-c", f'echo $$ > "{tasks}" && exec "$@"', "sh"]
        self.procs[name] = procs.spawn(
            [*self._enter, *join, *argv], self.dir / f"{name}.log", procs.go_env(full_env)
        )

    @property
    def store_root(self) -> Path:
        return (self.store or self.dir / "containerd") / "root"

    def _containerd(self) -> None:
        cfg = self.dir / "containerd.toml"
        cfg.write_text(containerd_config(self))
        self.store_root.mkdir(parents=True, exist_ok=True)
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        conflist = cni_config(self.net, self.n, self.dir / "ipam")
        (cni / "10-bridge.conflist").write_text(json.dumps(conflist, indent=1))
        self._spawn("containerd", [str(self.bins.node / "containerd"), "--config", str(cfg)])
        procs.wait_until(
            lambda: self.sock.exists() and self.ctr("version", check=False).returncode == 0,
            f"containerd on {self.name}", 60, self.procs["containerd"],
            self.dir / "containerd.log",
        )  # fmt: skip

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bins.node / "ctr"), "--address", str(self.sock), "-n", "k8s.io", *args]
        res = subprocess.run([*self._enter, *argv], capture_output=True, text=True)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res

    def _known_ids(self) -> set[str]:
        """The ids of the containers and sandboxes in the node's store."""
        kinds = ("containers", "sandboxes")
        return {i for k in kinds for i in self.ctr(k, "ls", "-q", check=False).stdout.split()}

    def _clear_leftovers(self) -> None:
        """Containers and sandboxes an earlier run left in the kept store (their processes are
        long gone): the kubelet of this run never knew them."""
        kinds = ("tasks", "containers", "sandboxes")
        listed = {k: self.ctr(k, "ls", "-q", check=False).stdout.split() for k in kinds}
        forget_cni_results({*listed["containers"], *listed["sandboxes"]})
        for kind, ids in listed.items():
            for i in ids:
                args = ("rm", "-f", i) if kind != "containers" else ("rm", i)
                self.ctr(kind, *args, check=False)

    def _import_images(self) -> bool:
        """Each archive once per store (its name carries the hash of what it was built from),
        and again if its image went missing from the store. Its layers are kept unpacked only:
        the packed copy would double the store (6 GB more for the training image)."""
        done_file = self.store_root.parent / IMPORTED
        done = imported_archives(self.store_root.parent)
        present = set(self.ctr("images", "ls", "-q").stdout.split())
        imported = False
        for archive in self.images:
            if archive.name not in done or image_name(archive) not in present:
                self.ctr("images", "import", "--local", "--discard-unpacked-layers", str(archive))
                with open(done_file, "a") as f:
                    f.write(archive.name + "\n")
                imported = True
        self._drop_replaced_images()
        return imported

    def _drop_replaced_images(self) -> None:
        """Images a newer import under the same name replaced (each rebuild of the operator's
        image), which the runtime still references by digest: removed with what only they
        use, so that the store holds what the node runs and no more."""
        rows = [line.split() for line in self.ctr("images", "ls").stdout.splitlines()[1:]]
        refs = [row for row in rows if len(row) > 2]  # REF TYPE DIGEST ...
        running = {image_name(archive) for archive in self.images}
        digests = {ref[2] for ref in refs if ref[0] in running}
        replaced = [ref[0] for ref in refs if ref[2] not in digests]
        if replaced:
            self.ctr("images", "rm", "--sync", *replaced)

    def _cgroups(self) -> None:
        """The node's cgroup root in every hierarchy (the kubelet makes what is below it), and
        the group its daemons run in."""
        for controller in CGROUP.iterdir():
            if controller.is_dir() and not controller.is_symlink():
                (controller / self.cgroup_root).mkdir(exist_ok=True)
        (CGROUP / "pids" / self.cgroup_root / "daemons").mkdir(exist_ok=True)
        procs.weigh_as_self(CGROUP / "cpu" / self.cgroup_root)

    def _kubelet(self) -> None:
        kdir = self.kubelet_dir
        shutil.rmtree(kdir, ignore_errors=True)
        kdir.mkdir(parents=True)
        serving = self.cp.serving_cert(f"kubelet-serving-{self.name}", (self.ip, self.name))
        kc = self.cp.user_kubeconfig(
            f"kubelet-{self.name}", f"system:node:{self.name}", ("system:nodes",)
        )
        resolv = self.dir / "resolv.conf"
        resolv.write_text("")  # pods get cluster DNS only; nothing of this machine's resolver
        cfg = self.dir / "kubelet.yaml"
        cfg.write_text(yaml.safe_dump(kubelet_config(self, serving.cert, serving.key, resolv)))
        self._spawn(
            "kubelet",
            [
                str(self.bins.kube / "kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={kc}",
                f"--root-dir={kdir}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                "--v=1",
            ],
        )

    def _kube_proxy(self) -> None:
        kc = self.cp.user_kubeconfig(f"kube-proxy-{self.name}", "system:kube-proxy")
        cfg = self.dir / "kube-proxy.yaml"
        cfg.write_text(yaml.safe_dump(kube_proxy_config(self, kc)))
        self._spawn("kube-proxy", [str(self.bins.kube / "kube-proxy"), f"--config={cfg}"])

    # -- what tests do to a node ---------------------------------------------------------------

    def pod_log_dir(self, ns: str, name: str, uid: str) -> Path:
        return self.dir / "pod-logs" / f"{ns}_{name}_{uid}"

    def pod_log(self, ns: str, name: str, uid: str) -> str:
        """What the pod's containers printed (all their runs), read from the kubelet's log
        files (CRI format: time, stream, tag, text) as `kubectl logs` would show it; a line
        still being written is left out, a long one's parts read so far are not."""
        read: LogsRead = {}
        text = self.pod_log_since(ns, name, uid, read)
        return text + "".join(partial for _, partial in read.values())

    def pod_log_since(self, ns: str, name: str, uid: str, read: LogsRead) -> str:
        """What the pod's containers printed since `read` was last given here (the bytes each
        file had then): a poller's cost grows with what is new, not with the whole log."""
        out: list[str] = []
        for path in sorted(self.pod_log_dir(ns, name, uid).glob("*/*.log"), key=runs):
            at, partial = read.get(str(path), (0, ""))
            with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
                f.seek(at)
                chunk = f.read()
                end = chunk.rfind(b"\n") + 1  # whole records only: the rest is read next time
                for line in chunk[:end].decode(errors="replace").splitlines():
                    parts = line.split(" ", 3)
                    if len(parts) < 4:
                        continue
                    partial += parts[3]
                    if parts[2] != "P":
                        out.append(partial + "\n")
                        partial = ""
                read[str(path)] = (at + end, partial)
        return "".join(out)

    def pod_cgroups(self, uid: str) -> list[Path]:
        """The cgroup directories (pids controller) of a pod's containers."""
        base = CGROUP / "pids" / self.cgroup_root / "kubepods"
        slug = "pod" + uid
        return [Path(d) for d, _, _ in os.walk(base) if Path(d).name.startswith(slug)]

    def pod_pids(self, uid: str) -> list[int]:
        """This machine's pids of a pod's container processes."""
        return [pid for cg in self.pod_cgroups(uid) for pid in tree_pids(cg)]

    def kill_pod_processes(self, uid: str, sig: int = signal.SIGKILL) -> int:
        """Kill every process of a pod's containers, as the OOM killer or a crash would; the
        runtime sees its containers exit. Returns how many processes were signalled."""
        count = 0
        for pid in self.pod_pids(uid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                count += 1
        return count

    # -- stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Every process of the node's pods, then the node's own, then its namespaces and
        cgroups: nothing of it is left running or mounted."""
        procs.stop(self.procs.pop("kubelet", None), grace=5)
        procs.stop(self.procs.pop("kube-proxy", None), grace=5)
        ids = self._known_ids() if "containerd" in self.procs else set()
        self._kill_cgroup_tree("kubepods")  # the pods' processes
        procs.stop(self.procs.pop("containerd", None), grace=10)  # its store stays whole
        forget_cni_results(ids)
        self._kill_cgroup_tree()  # the shims
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()
        if self._mnt is not None:
            subprocess.run(["umount", str(self._mnt)], check=False, capture_output=True)
            self._mnt.unlink(missing_ok=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.kubelet_dir, ignore_errors=True)
        self._remove_cgroups()

    def _kill_cgroup_tree(self, sub: str = "") -> None:
        kill_tree(CGROUP / "pids" / self.cgroup_root / sub)

    def _remove_cgroups(self) -> None:
        for controller in CGROUP.iterdir():
            remove_tree(controller / self.cgroup_root)
