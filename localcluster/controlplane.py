"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-controller-manager.

The binaries come from hack/build-controlplane.sh (built from Go modules, cached per version).
The apiserver runs as a cluster's does: TLS on loopback, client certificates and
service-account tokens, Node+RBAC authorization, the default admission plugins plus
NodeRestriction and OwnerReferencesPermissionEnforcement, and an audit log of every request of
the service accounts (what the least-privilege test reads). The controller manager runs the
controllers that work without real nodes: garbage collection, namespaces, service accounts and
their tokens, endpoint slices and the root CA publisher (not node lifecycle or pod GC, which
would evict pods of nodes that never heartbeat).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcluster import pki, procs

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "hack" / "build-controlplane.sh"
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "endpointslice-controller",
    "root-ca-certificate-publisher-controller",
)
# With real kubelets, which heartbeat: clear the not-ready taint, mark lost nodes, evict from
# them, and collect pods of deleted nodes, as on any cluster; and run Deployments (the
# operator's own).
NODE_CONTROLLERS = (
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    # Claims: bound to the volumes a provisioner makes (storage.py), and not deleted in use.
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
)
ADMISSION = "NodeRestriction,OwnerReferencesPermissionEnforcement"
# Kubernetes' own Workload API (gang scheduling: Workload, PodGroup, pods' schedulingGroup),
# alpha in 1.36: its API group and gates on the apiserver, the scheduler and the controller
# manager (which lifts a PodGroup's protection once no pod uses it).
WORKLOAD_GATES = "GenericWorkload=true,GangScheduling=true"
WORKLOAD_API = "scheduling.k8s.io/v1alpha2=true"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Service accounts' requests are audited (the operator's RBAC is compared with them); everyone
# else's are not, which keeps the log small.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # ResponseStarted is kept: a watch is logged when it opens, not only when it ends.
    "omitStages": ["RequestReceived"],
    "rules": [
        # The controller-manager's own accounts (every controller's requests): no test reads
        # them, and they were most of the log each read of it parses.
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def binaries() -> Path:
    """The directory with etcd and the Kubernetes binaries (control plane, kubectl, kubelet,
    kube-proxy, kubemark)."""
    env = os.environ.get("ETOPERATOR_CONTROLPLANE_BIN")
    return Path(env) if env else procs.built(BUILD)


def kubeconfig(server: str, ca: Path, user: dict[str, str], path: Path) -> Path:
    """A kubeconfig for one user (client certificate or bearer token)."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def cert_user(pair: pki.Pair) -> dict[str, str]:
    return {"client-certificate": str(pair.cert), "client-key": str(pair.key)}


@dataclass
class ControlPlane:
    dir: Path
    bin: Path = field(default_factory=binaries)
    port: int = 0  # the apiserver's secure port (0: a free one)
    address: str = "127.0.0.1"  # where it listens; pods of real nodes reach it there
    real_nodes: bool = False  # pods reach the apiserver at `address` (the lease reconciler)
    scheduling: bool = False  # kube-scheduler and the node controllers run (any kind of node)
    workload_api: bool = True  # scheduling.k8s.io/v1alpha2 served, gang scheduling on
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # The audit log read so far (tests poll it; a whole read was seconds of CPU late in a run).
    _audit: list[dict[str, Any]] = field(default_factory=list)
    _audit_at: int = 0

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def ca(self) -> Path:
        return self.dir / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.dir / "audit.log"

    def kubectl_path(self) -> Path:
        return self.bin / "kubectl"

    def start(self, before_controllers: Callable[[], object] = lambda: None) -> ControlPlane:
        """etcd and the apiserver, then `before_controllers` (install CRDs there: the garbage
        collector watches the owners it discovers at start), then the controller manager."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or procs.free_port()
        ca = pki.CA(self.dir / "pki").create()
        self._ca = ca
        self._etcd()
        self._apiserver(ca)
        admin = ca.issue("admin", "etoperator-admin", ("system:masters",))
        kubeconfig(self.url, ca.cert, cert_user(admin), self.admin_kubeconfig)
        before_controllers()
        self._controller_manager(ca)
        if self.scheduling:
            self._scheduler()
        return self

    def user_kubeconfig(
        self, name: str, cn: str, orgs: tuple[str, ...] = (), server: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as user `cn` in groups `orgs` (a client certificate)."""
        pair = self._ca.issue(name, cn, orgs)
        return kubeconfig(
            server or self.url, self.ca, cert_user(pair), self.dir / f"{name}.kubeconfig"
        )

    def serving_cert(self, name: str, hosts: tuple[str, ...]) -> pki.Pair:
        return self._ca.issue(name, name, hosts=hosts, server=True)

    def token_kubeconfig(self, token: str, path: Path, server: str | None = None) -> Path:
        return kubeconfig(server or self.url, self.ca, {"token": token}, path)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = procs.spawn(argv, self.dir / f"{name}.log", procs.go_env())
        self.procs[name] = proc
        return proc

    def _etcd(self) -> None:
        client, peer = procs.free_port(), procs.free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=local",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=local=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        procs.wait_until(
            lambda: _http_ok(f"{self.etcd_url}/health"),
            "etcd",
            30,
            proc,
            self.dir / "etcd.log",
        )

    def _apiserver(self, ca: pki.CA) -> None:
        names = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")
        hosts = (self.address, "127.0.0.1", "localhost", "10.96.0.1", *names)
        serving = ca.issue("apiserver", "kube-apiserver", hosts=hosts, server=True)
        kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client")
        sa_key, sa_pub = pki.service_account_keys(ca.dir)
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.port}",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={ADMISSION}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={ca.cert}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=batch",
                "--audit-log-batch-max-wait=1s",
                "--allow-privileged=true",
                # Pods reach the apiserver through the `kubernetes` Service only on real nodes.
                f"--endpoint-reconciler-type={'lease' if self.real_nodes else 'none'}",
                "--profiling=false",
                "--v=0",
                *self.gates(api=True),
            ],
        )
        self._https_ctx = ssl.create_default_context(cafile=str(ca.cert))
        procs.wait_until(self._ready, "kube-apiserver", 90, proc, self.dir / "kube-apiserver.log")

    def kill_apiserver(self) -> None:
        """SIGKILL the apiserver, as a crash or a control-plane upgrade does."""
        proc = self.procs["kube-apiserver"]
        proc.kill()
        proc.wait()

    def start_apiserver(self) -> None:
        """The apiserver again, with the same arguments, once it is ready."""
        old = self.procs["kube-apiserver"]
        assert old.poll() is not None, "the apiserver still runs"
        proc = self._spawn("kube-apiserver", [str(a) for a in old.args])  # type: ignore[union-attr]
        procs.wait_until(self._ready, "kube-apiserver", 90, proc, self.dir / "kube-apiserver.log")

    @contextlib.contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """One component (e.g. "kube-controller-manager") stopped, not ended, meanwhile: what
        it keeps up to date lags (no EndpointSlice for a new Service, so cluster DNS does not
        know its name), as after an apiserver restart or on a loaded control plane."""
        with procs.paused(self.procs[name]):
            yield

    def _ready(self) -> bool:
        # /readyz is open to unauthenticated users (system:public-info-viewer).
        return _http_ok(f"{self.url}/readyz", self._https_ctx)

    def _controller_manager(self, ca: pki.CA) -> None:
        kc = self.user_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--controllers={','.join(self.controllers)}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={ca.dir / 'sa.key'}",
                f"--root-ca-file={ca.cert}",
                "--leader-elect=false",
                "--secure-port=0",
                "--concurrent-gc-syncs=10",
                "--v=0",
                *self.gates(),
            ],
        )

    @property
    def controllers(self) -> tuple[str, ...]:
        gang = ("podgroup-protection-controller",) if self.workload_api else ()
        return (*CONTROLLERS, *gang, *(NODE_CONTROLLERS if self.scheduling else ()))

    def _scheduler(self) -> None:
        kc = self.user_kubeconfig("kube-scheduler", "system:kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                # Binding thousands of pods (hollow nodes) at the default 50 a second would be
                # the slowest part of the benchmarks; large clusters raise it too.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--v=0",
                *self.gates(),
            ],
        )

    def gates(self, api: bool = False) -> list[str]:
        if not self.workload_api:
            return []
        return [
            f"--feature-gates={WORKLOAD_GATES}",
            *([f"--runtime-config={WORKLOAD_API}"] if api else []),
        ]

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs.values())

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            procs.stop(self.procs.pop(name, None))

    def audit(self) -> list[dict[str, Any]]:
        """The audit log's events (one JSON object a line), read on from where the last call
        stopped (the apiserver only appends to it); a line still being written waits for the
        next call."""
        if not self.audit_log.exists():
            return []
        with self.audit_log.open("rb") as f:
            if f.seek(0, 2) < self._audit_at:  # a new file: read it from its start
                self._audit, self._audit_at = [], 0
            f.seek(self._audit_at)
            chunk = f.read()
        whole = chunk.rfind(b"\n") + 1
        for line in chunk[:whole].splitlines():
            try:
                self._audit.append(json.loads(line))
            except ValueError:
                continue  # not an event
        self._audit_at += whole
        return list(self._audit)


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
