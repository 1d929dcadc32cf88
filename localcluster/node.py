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
import re
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from localcluster import procs
from localcluster.controlplane import ControlPlane
from localcluster.network import LOCKS, NETNS_DIR, Network, free_slots, locked

GLOBAL_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory")
CGROUP = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "localhost/etoperator/pause:local"
CLUSTER_DOMAIN = "cluster.local"
NAMESPACES = Path("/run/etoperator-nodes")  # bind mounts that keep mount namespaces alive
KUBELET_ROOTS = Path("/var/lib/etoperator-nodes")
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
        with self._import_turn():
            self._seed_store()
            self._containerd()
            self._clear_leftovers()
            if self._import_images():
                self._refresh_seed()
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

    # -- the seed: one store's images shared by every store, through hard links ----------------

    @property
    def seed(self) -> Path | None:
        return self.store.parent / "seed" if self.store is not None else None

    def _seed_store(self) -> None:
        """A node's store is made from the seed by hard links: an image's unpacked layers are
        files no container writes (each container writes to a layer of its own), so every
        store can share them, and a new store needs no import (two minutes and 6 GB for the
        training image, once per node of every cluster slot). A store that lacks an image the
        seed has (an image rebuilt since) is made again from the seed: it is only a cache, and
        no cluster but this node's uses it (its slot is held)."""
        seed, store = self.seed, self.store
        if seed is None or store is None or self._current(store):
            return
        with locked(seed.with_name("seed.lock")):
            if not (seed / "root").is_dir():
                return
            if (store / SHARED).exists() and not self._current(seed):
                return  # as close to current as the seed, and shared already: import here
            shutil.rmtree(store, ignore_errors=True)
            _link_copy(seed, store)

    def _current(self, store: Path) -> bool:
        """Whether `store` holds every image this node runs (by the archives imported)."""
        return {archive.name for archive in self.images} <= imported_archives(store)

    @contextlib.contextmanager
    def _import_turn(self) -> Iterator[None]:
        """While a store must import (no store is current yet: an image was rebuilt), one node
        of this machine imports at a time: the next ones find the seed current once the first
        has refreshed it, and link instead of importing the same 6 GB again."""
        seed, store = self.seed, self.store
        if seed is None or store is None or self._current(store) or self._current(seed):
            yield
            return
        with locked(seed.with_name("import.lock")):
            yield

    def _refresh_seed(self) -> None:
        """After an import, the seed becomes a copy of this store (made while no pod ran yet),
        once the runtime has dropped the packed layers (they are not worth sharing)."""
        seed, store = self.seed, self.store
        assert seed is not None and store is not None
        blobs = self.store_root / "io.containerd.content.v1.content" / "blobs"

        def packed() -> int:
            return sum(f.stat().st_size for f in blobs.rglob("*") if f.is_file())

        deadline = time.monotonic() + 60
        while packed() > 50 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.5)
        with locked(seed.with_name("seed.lock")):
            fresh = seed.with_name("seed.new")
            _link_copy(store, fresh)
            shutil.rmtree(seed, ignore_errors=True)
            fresh.rename(seed)
            _prune_idle_stores(seed.parent)

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
        """What the pod's first container printed (all its runs), read from the kubelet's log
        files (CRI format: time, stream, tag, text) as `kubectl logs` would show it."""
        files = sorted(
            self.pod_log_dir(ns, name, uid).glob("*/*.log"),
            key=lambda p: (p.parent.name, p.stat().st_mtime),
        )
        out: list[str] = []
        for f in files:
            for line in f.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                if len(parts) == 4:
                    out.append(parts[3] + ("" if parts[2] == "P" else "\n"))
        return "".join(out)

    def pod_cgroups(self, uid: str) -> list[Path]:
        """The cgroup directories (pids controller) of a pod's containers."""
        base = CGROUP / "pids" / self.cgroup_root / "kubepods"
        slug = "pod" + uid
        return [Path(d) for d, _, _ in os.walk(base) if Path(d).name.startswith(slug)]

    def kill_pod_processes(self, uid: str, sig: int = signal.SIGKILL) -> int:
        """Kill every process of a pod's containers, as the OOM killer or a crash would; the
        runtime sees its containers exit. Returns how many processes were signalled."""
        count = 0
        for cg in self.pod_cgroups(uid):
            for pid in tree_pids(cg):
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
        _kill_tree(CGROUP / "pids" / self.cgroup_root / sub)

    def _remove_cgroups(self) -> None:
        for controller in CGROUP.iterdir():
            _remove_tree(controller / self.cgroup_root)


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


SHARED = "shared"  # in a store made from the seed, or one the seed was made from
# The archives imported into a store (their names carry the hash of what they were built from).
# "-unpacked": stores filled before layers were discarded are imported into once more.
IMPORTED = "imported-unpacked"


def _link_copy(src: Path, dst: Path) -> None:
    """`dst` as a copy of the store `src` whose files are hard links, but for what is written
    in place (containerd's databases, our import record): those are copies of their own."""
    shutil.rmtree(dst, ignore_errors=True)
    tmp = dst.with_name(dst.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    res = subprocess.run(["cp", "-a", "--link", str(src), str(tmp)], capture_output=True, text=True)
    # What the runtime removes meanwhile (the leftovers of an unpack, collected just after it)
    # is skipped: its databases, copied last, no longer name it.
    errors = [e for e in res.stderr.splitlines() if "No such file or directory" not in e]
    if res.returncode != 0 and errors:
        raise RuntimeError(f"copying {src}: {'; '.join(errors)}")
    for f in [*tmp.rglob("*.db"), *tmp.glob("imported*")]:
        own = f.with_name(f.name + ".own")
        shutil.copy2(f, own)
        os.replace(own, f)
    for store in (src, tmp):
        (store / SHARED).touch()
    tmp.rename(dst)


def imported_archives(store: Path) -> set[str]:
    """The archives imported into `store` so far (none for a store not made yet)."""
    done = store / IMPORTED
    return set(done.read_text().split()) if done.exists() else set()


def _prune_idle_stores(stores: Path) -> None:
    """The stores of slots no cluster holds, once the seed has moved on (an image rebuilt):
    what only they kept is an old image (6 GB); a node of such a slot is made again from the
    seed, in seconds. Called with the seed's lock held."""
    for slot in free_slots():
        for store in stores.glob(f"etok{slot}-n*"):
            shutil.rmtree(store, ignore_errors=True)


def reclaim(slot: int) -> bool:
    """Everything of a slot's nodes that a killed run left: processes (pods, shims), mount
    namespaces, cgroups; whether there was any. (The network goes with Network.delete.)"""
    prefix = f"etoperator-etok{slot}-"
    roots = sorted((CGROUP / "pids").glob(prefix + "*"))
    for root in roots:
        _kill_tree(root)
    anchors = sorted(NAMESPACES.glob(f"etok{slot}-n*.mnt")) if NAMESPACES.exists() else []
    for anchor in anchors:
        subprocess.run(["umount", str(anchor)], check=False, capture_output=True)
        anchor.unlink(missing_ok=True)
        shutil.rmtree(anchor.with_suffix(""), ignore_errors=True)
        shutil.rmtree(KUBELET_ROOTS / anchor.stem, ignore_errors=True)
    for controller in CGROUP.iterdir():
        for root in controller.glob(prefix + "*") if not controller.is_symlink() else []:
            _remove_tree(root)
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


def _kill_tree(base: Path) -> None:
    """SIGKILL every process under a pids cgroup until none is left."""
    for _ in range(50):
        pids = [pid for pid in tree_pids(base) if pid != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove_tree(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=_depth, reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def image_name(archive: Path) -> str:
    """The name a docker-archive gives its image (its manifest.json's first RepoTag)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None, f"{archive} has no manifest.json"
        tags = json.load(member)[0]["RepoTags"]
    return str(tags[0])


def _depth(p: Path) -> int:
    return len(p.parts)


def containerd_config(node: RealNode) -> str:
    """containerd 2.x (config version 3): its state under the node's directory, runc from our
    build, the CNI bridge; no OOM score below our own (root here lacks CAP_SYS_RESOURCE) and no
    AppArmor (not on this kernel)."""
    d = node.dir / "containerd"
    return f"""version = 3
root = "{node.store_root}"
state = "{node.run_dir / "state"}"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{node.sock}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{node.bins.cni}"]
    conf_dir = "{node.dir / "cni"}"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{node.bins.node / "runc"}"
        SystemdCgroup = false
[plugins.'io.containerd.internal.v1.opt']
  path = "{d / "opt"}"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(net: Network, n: int, ipam_dir: Path) -> dict[str, object]:
    """The node's pod network. Its addresses are handed out from a store of its own: in a store
    shared by nodes (the plugin's default, in this machine's /var/lib/cni) each node found the
    other's last address, started again from the bottom of its range and gave a new pod the
    address of one just deleted, which the node still reached at the old pod's MAC for ~40 s.
    No masquerade: a pod sees its peers' own addresses, on this node or another (routed node to
    node, Network.add_node), as in a cluster's pod network."""
    return {
        "cniVersion": "1.0.0",
        "name": cni_network(net.slot),
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.pod_cidr(n)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: RealNode, cert: Path, key: Path, resolv: Path) -> dict[str, object]:
    """A kubelet for cgroup v1 and no swap accounting, that never deletes the local images
    (there is no registry to pull them again) and never evicts for disk."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{node.sock}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup_root}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "clusterDNS": [node.dns],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv),
        "podLogsDir": str(node.dir / "pod-logs"),
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(node.cp.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "imageMinimumGCAge": "876000h",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "healthzPort": 10248,
        "staticPodPath": "",
        "registerNode": True,
        "maxPods": 110,
        "podCIDR": node.net.pod_cidr(node.n),
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(node: RealNode, kubeconfig: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "clusterCIDR": node.net.cluster_cidr,
        "conntrack": {"maxPerCore": 0},  # a global sysctl: leave it alone
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }
