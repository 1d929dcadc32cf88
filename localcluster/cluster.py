"""A whole local cluster: the control plane, the operator's CRDs and RBAC from deploy/, nodes,
and the operator.

Nodes are real (`nodes=N`: containerd + kubelet + kube-proxy each, kube-scheduler, CoreDNS;
nodes.py) or, for the benchmarks of thousands of pods, kubemark's hollow nodes (`hollow=N`).
The operator runs as users run it (`deploy=True`: the Deployment of deploy/ with the image built
from deploy/Dockerfile) or as a process of this machine under its ServiceAccount's token (when a
test stands between it and the apiserver, or kills and restarts it)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from etoperator import kube
from localcluster import procs
from localcluster.controlplane import ROOT, ControlPlane
from localcluster.hollow import HollowNodes
from localcluster.kueue import Kueue
from localcluster.network import SLOTS, Network, claim_slot, free_slots, machine_lock
from localcluster.node import LogsRead, RealNode, release_namespaces_dir, restore_sysctls
from localcluster.nodeclean import reclaim
from localcluster.nodes import Nodes, wait_ready
from localcluster.operatorproc import OPERATOR_NS as OPERATOR_NS
from localcluster.operatorproc import OPERATOR_SA as OPERATOR_SA
from localcluster.operatorproc import OPERATOR_USER as OPERATOR_USER
from localcluster.operatorproc import OperatorProcess
from localcluster.storage import Storage

CRDS = ("trainingjobs", "scaleouts", "scaleins")


class KubectlFailed(AssertionError):
    """A kubectl call that had to succeed did not; the message has its stderr."""


@dataclass
class DeployedOperator:
    """The operator as deploy/ runs it: a Deployment of two replicas, one leading."""

    cluster: LocalCluster

    def pods(self) -> list[str]:
        out = self.cluster.kubectl(
            "get", "pods", "-n", OPERATOR_NS, "-l", OPERATOR_LABEL, "-o", "name"
        )
        return out.split()

    def leader(self) -> str:
        """The pod holding the Lease."""
        return self.cluster.kubectl(
            "get", "lease", "etoperator", "-n", OPERATOR_NS,
            "-o", "jsonpath={.spec.holderIdentity}", check=False,
        ).strip()  # fmt: skip

    def tail(self, n: int = 60) -> str:
        leader = self.leader()
        target = f"pod/{leader}" if leader else "deploy/etoperator"
        return self.cluster.kubectl("logs", "-n", OPERATOR_NS, target, f"--tail={n}", check=False)


OPERATOR_LABEL = "app.kubernetes.io/name=etoperator"


def last_cluster_stopped() -> None:
    """What local clusters share on this machine goes back once none runs: the sysctls the
    kubelets set, the directory that anchors their mount namespaces. (A cluster killed before
    it could stop leaves them to the next one to stop.) No cluster claims a slot meanwhile."""
    with machine_lock("slots"):
        if len(list(free_slots())) == SLOTS:
            restore_sysctls()
            release_namespaces_dir()


def clear_killed_runs() -> list[int]:
    """What clusters killed before they could stop left in the slots no cluster holds (their
    pods' processes, namespaces, links, cgroups, mounts), and once none runs what they share.
    Returns the slots that held something."""
    cleared = []
    for slot in free_slots():
        nodes = reclaim(slot)
        if Network(slot).delete() or nodes:
            cleared.append(slot)
    last_cluster_stopped()
    return cleared


@dataclass
class LocalCluster:
    dir: Path
    ssh_port: int = 22
    operator_args: list[str] = field(default_factory=list)
    api_port: int = 0
    nodes: int = 0  # real nodes
    hollow: int = 0  # hollow nodes (kubemark), with room for `max_pods` pods each
    max_pods: int = 110
    deploy: bool = False  # the operator from deploy/ (real nodes only)
    kueue: bool = False  # Kueue's manager, CRDs and webhooks (kueue.py)
    workload_api: bool = True  # Kubernetes' Workload API and gang scheduling (controlplane.py)
    progress: Callable[[str], None] = lambda _: None
    cp: ControlPlane | None = None
    real: Nodes | None = None
    hollow_nodes: HollowNodes | None = None
    queues: Kueue | None = None
    storage: Storage | None = None  # ReadWriteMany volumes on real nodes (storage.py)
    operator: OperatorProcess | None = None
    deployed: DeployedOperator | None = None
    _slot_lock: int | None = None
    _where: dict[tuple[str, str], tuple[RealNode, str]] = field(default_factory=dict)
    _api: kube.Kube | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.cp is not None
        return self.cp.admin_kubeconfig

    def run_kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl of the control plane's version, as the cluster's admin."""
        assert self.cp is not None
        res = subprocess.run(
            [str(self.cp.kubectl_path()), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )
        if check and res.returncode != 0:
            raise KubectlFailed(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
        return res

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.run_kubectl(*args, input=input, check=check).stdout

    def start(self, operator: bool = True, server: str | None = None) -> LocalCluster:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cp = ControlPlane(
            self.dir / "controlplane", port=self.api_port, workload_api=self.workload_api
        )
        if self.nodes:
            clear_killed_runs()
            slot, self._slot_lock = claim_slot()
            self.real = Nodes(self.dir / "nodes", self.nodes)
            self.cp.address = self.real.network(slot).gateway
            self.cp.real_nodes = True
        self.cp.scheduling = bool(self.nodes or self.hollow)
        self.cp.start(before_controllers=self.install)
        self.progress(f"control plane up at {self.cp.url}")
        if self.real is not None:
            self.real.start(self.cp, lambda text: self.kubectl("apply", "-f", "-", input=text))
            wait_ready(self.kubectl, self.nodes)
            self.progress(f"{self.nodes} node(s) Ready (containerd, kubelet, kube-proxy)")
            self.storage = Storage(self.dir / "storage", self.cp).start()
            self.progress("the local-path provisioner up (StorageClass shared)")
        elif self.hollow:
            self.hollow_nodes = HollowNodes(self.dir / "hollow", self.hollow, self.max_pods)
            self.hollow_nodes.start(self.cp)
            wait_ready(self.kubectl, self.hollow, timeout=120)
            self.progress(f"{self.hollow} hollow node(s) Ready")
        if self.kueue:
            self.queues = Kueue(self.dir / "kueue", self.cp).start()
            self.progress("Kueue up (its CRDs, webhooks and manager)")
        if operator and self.deploy:
            self.deploy_operator()
        elif operator:
            self.start_operator(server)
        return self

    def deploy_operator(self) -> DeployedOperator:
        """`kubectl apply -k deploy/`, as a user installs it, and both replicas Ready."""
        self.kubectl("apply", "-k", str(ROOT / "deploy"))
        self.kubectl("rollout", "status", "deploy/etoperator", "-n", OPERATOR_NS, "--timeout=180s")
        self.deployed = DeployedOperator(self)
        self.progress("operator deployed (2 replicas)")
        return self.deployed

    def start_operator(self, server: str | None = None, warm: bool = False) -> OperatorProcess:
        """The operator, reaching the apiserver at `server` (default: directly); with `warm`,
        quick to restart (OperatorProcess.warm)."""
        self.operator = OperatorProcess(
            self.operator_kubeconfig(server), self.dir / "operator.log", self.ssh_port,
            extra=list(self.operator_args), warm=warm,
        )  # fmt: skip
        self.operator.start()
        self.progress("operator started")
        return self.operator

    def install(self) -> None:
        """The CRDs and the operator's namespace, ServiceAccount and RBAC, as deploy/ has them."""
        self.kubectl("apply", "-k", str(ROOT / "crds"))
        for doc in ("namespace.yaml", "rbac.yaml"):
            self.kubectl("apply", "-f", str(ROOT / "deploy" / doc))
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{c}.kai.alibabacloud.com" for c in CRDS),
        )  # fmt: skip

    def operator_kubeconfig(self, server: str | None = None) -> Path:
        """A kubeconfig with a token of the operator's ServiceAccount (RBAC applies to it)."""
        assert self.cp is not None
        token = self.kubectl(
            "create", "token", OPERATOR_SA, "-n", OPERATOR_NS, "--duration=48h"
        ).strip()
        return self.cp.token_kubeconfig(token, self.dir / "operator.kubeconfig", server)

    @property
    def api(self) -> kube.Kube:
        """The admin's API client, for what the harness reads and makes often (a kubectl is
        0.1 s of CPU and its own discovery: the suite ran 1,500 of them)."""
        if self._api is None:
            self._api = kube.Kube(kube.load_config(str(self.kubeconfig), connections=4))
        return self._api

    def create_namespace(self, ns: str) -> None:
        """A namespace, ready for pods: its default ServiceAccount and root CA exist."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        k8s.CoreV1Api(self.api.api).create_namespace(body)
        self.wait_namespace_ready(ns)

    def delete_namespace(self, ns: str) -> None:
        """Deleted in the background; gone already is fine."""
        try:
            k8s.CoreV1Api(self.api.api).delete_namespace(ns)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def wait_namespace_ready(self, ns: str) -> None:
        """A namespace's default ServiceAccount and root CA exist (pods need both)."""
        procs.wait_until(
            lambda: bool(self.api.get("ServiceAccount", ns, "default"))
            and bool(self.api.get("ConfigMap", ns, "kube-root-ca.crt")),
            f"namespace {ns}", 30,
        )  # fmt: skip

    def _placed(self, ns: str, name: str) -> tuple[RealNode, str] | None:
        """The real node a pod runs on, and its uid (None: not bound yet, or gone)."""
        assert self.real is not None
        pod = self.api.get("Pod", ns, name)
        if pod is None:
            return None
        node = pod["spec"].get("nodeName")
        return (self.real.node_of(node), pod["metadata"]["uid"]) if node else None

    def kill_pod(self, ns: str, name: str) -> None:
        """Kill every process of a pod's containers, as a crash or the OOM killer would."""
        placed = self._placed(ns, name)
        assert placed is not None, f"pod {ns}/{name} is not running on a node"
        placed[0].kill_pod_processes(placed[1])

    def pod_pids(self, ns: str, name: str) -> list[int]:
        """This machine's pids of a pod's container processes (none: not placed, or gone)."""
        placed = self._placed(ns, name)
        return [] if placed is None else placed[0].pod_pids(placed[1])

    def pod_log(self, ns: str, name: str) -> str:
        """The pod's output so far, from its node's log files (cheap enough to poll: where a pod
        runs is looked up once per pod)."""
        placed = self._where_now(ns, name)
        return "" if placed is None else placed[0].pod_log(ns, name, placed[1])

    def pod_log_since(self, ns: str, name: str, read: LogsRead) -> str:
        """What the pod printed since `read` was last given for it (node.pod_log_since)."""
        placed = self._where_now(ns, name)
        return "" if placed is None else placed[0].pod_log_since(ns, name, placed[1], read)

    def _where_now(self, ns: str, name: str) -> tuple[RealNode, str] | None:
        placed = self._where.get((ns, name))
        if placed is None or not placed[0].pod_log_dir(ns, name, placed[1]).exists():
            placed = self._placed(ns, name)
            if placed is None:
                return None
            self._where[(ns, name)] = placed
        return placed

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.queues is not None:
            self.queues.stop()
        if self.storage is not None:
            self.storage.stop()
        if self.hollow_nodes is not None:
            self.hollow_nodes.stop()
        if self.real is not None:
            self.real.stop()
        if self.cp is not None:
            self.cp.stop()
        if self.real is not None and self.real.net is not None:
            self.real.net.delete()
        if self._slot_lock is not None:
            os.close(self._slot_lock)
            self._slot_lock = None
            last_cluster_stopped()
