"""The tests' plumbing: the integration tier's `Cluster` (real nodes, Kueue, the operator as a
process of this machine behind a fault proxy) on top of the local cluster's face
(localcluster/world.py), which the benchmarks share."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from etoperator import kube
from localcluster import procs
from localcluster.cluster import LocalCluster
from localcluster.controlplane import ControlPlane
from localcluster.manifests import EXIT_FILE, GATE_PID, REFUSED_KEYS
from localcluster.operatorproc import OperatorProcess
from localcluster.world import (
    ROOT,
    Chain,
    Hollow,
    Timeout,
    World,
    start_chain,
    start_hollow,
    wait_for,
)
from tests.faultproxy import FaultProxy

__all__ = [
    "ROOT",
    "Chain",
    "Cluster",
    "Hollow",
    "Timeout",
    "World",
    "start_chain",
    "start_cluster",
    "start_hollow",
    "wait_for",
]


def start_cluster(
    tmp: Path, nodes: int, extra: list[str] | None = None, kueue: bool = False
) -> Cluster:
    """The real control plane, real nodes (and Kueue), and the operator as a process of this
    machine under its deploy/ RBAC, reaching the apiserver directly (or through a fault proxy,
    tests/faultproxy.py, for the tests that ask: `Cluster.route`) and the pods over the nodes'
    network, as it would from inside the cluster."""
    local = LocalCluster(tmp, nodes=nodes, operator_args=list(extra or []), kueue=kueue)
    try:
        local.start(operator=False)
        assert local.cp is not None
        proxy = FaultProxy(local.cp).start()
        operator = local.start_operator(warm=True)  # tests restart it often
    except BaseException:
        local.stop()
        raise
    api = kube.Kube(kube.load_config(str(local.kubeconfig)))
    return Cluster(local, local.kubeconfig, api, local.cp, operator, proxy)


LINGER = "etoperator.test/linger"


@dataclass
class Cluster(World):
    """What tests do to pods here is what happens to pods anywhere: a container ends with a
    code (the gates of localcluster/manifests.py), nodes are cordoned (new pods stay Pending),
    a finalizer keeps a deleted pod terminating."""

    cp: ControlPlane
    operator: OperatorProcess
    fault_proxy: FaultProxy
    ssh_port: int = 22
    proxied: bool = False  # the operator's requests pass the fault proxy

    @property
    def proxy(self) -> FaultProxy:
        """The fault proxy, for a test whose operator reaches the apiserver through it."""
        assert self.proxied, "the operator reaches the apiserver directly: mark the test `faults`"
        return self.fault_proxy

    def route(self, proxied: bool) -> None:
        """The operator's requests through the fault proxy or straight to the apiserver, the
        operator restarted if that changes. The proxy is Python relaying every byte of every
        watch, TLS both ways: over half of a test process's CPU, spent only where a test
        injects faults."""
        if proxied == self.proxied:
            return
        self.operator.kill()
        path = self.operator.kubeconfig
        cfg = yaml.safe_load(path.read_text())
        server = self.fault_proxy.url if proxied else self.cp.url
        cfg["clusters"][0]["cluster"]["server"] = server
        path.write_text(yaml.safe_dump(cfg))
        self.proxied = proxied
        self.operator.start()

    def finish(self, ns: str, name: str, code: int = 0) -> None:
        """The pod's container ends with exit code `code` (Succeeded for 0, else Failed). The
        container may end before the exec's stream does (its gate ends at the signal): the
        exec then reads as killed, and the container's own end is what counts."""
        done = self.exec(ns, name, "sh", "-c", f"echo {int(code)} > {EXIT_FILE}.new && "
                         f"mv {EXIT_FILE}.new {EXIT_FILE} && "
                         f"{{ ! [ -e {GATE_PID} ] || kill -USR1 \"$(cat {GATE_PID})\"; }}",
                         check=False)  # fmt: skip
        if done.returncode != 0:
            wait_for(lambda: self.exit_code(ns, name) is not None, 10, f"{name} ended")
            assert self.exit_code(ns, name) == code, done.stderr

    def exit_code(self, ns: str, name: str) -> int | None:
        pod = self.api.get("Pod", ns, name) or {}
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (cs.get("state") or {}).get("terminated")
            if ended is not None:
                return int(ended.get("exitCode", -1))
        return None

    def node_names(self) -> list[str]:
        assert self.local.real is not None
        return [n.name for n in self.local.real.nodes]

    def paused_kubelet(self, node: str) -> AbstractContextManager[None]:
        """Node `node`'s kubelet stopped meanwhile: its pods run on and nothing is done to
        them (no preStop, no delete carried out), as on a loaded or hung node."""
        assert self.local.real is not None
        return procs.paused(self.local.real.node_of(node).procs["kubelet"])

    def hold(self) -> None:
        """Every node cordoned: pods made from now on stay Pending, those running run on."""
        self.kubectl("cordon", *self.node_names())

    def release(self) -> None:
        """Every node schedulable again (after each test: a kubectl process only if needed)."""
        held = [
            n for n in self.node_names()
            if ((self.api.get_cluster("Node", n) or {}).get("spec") or {}).get("unschedulable")
        ]  # fmt: skip
        if held:
            self.kubectl("uncordon", *held)

    def annotate(self, ns: str, pod: str, key: str, value: str) -> None:
        self.kubectl("annotate", "pod", "-n", ns, pod, f"{key}={value}", "--overwrite")

    def accept_key(self, ns: str, pod: str) -> None:
        """A worker started with the refuse-key annotation now trusts the job's key (once its
        container runs)."""
        copy = ("cp", "/root/.ssh/authorized_keys", REFUSED_KEYS)
        wait_for(lambda: self.exec(ns, pod, *copy, check=False).returncode == 0, 30,
                 f"{pod} trusting the job's key", interval=0.2)  # fmt: skip

    def linger(self, ns: str, pod: str) -> None:
        """A finalizer of the test's: once deleted, the pod stays terminating until `unlinger`."""
        patch = [{"op": "add", "path": "/metadata/finalizers", "value": [LINGER]}]
        self.kubectl("patch", "pod", "-n", ns, pod, "--type=json", "-p", json.dumps(patch))

    def unlinger(self, ns: str, pod: str) -> None:
        patch = '{"metadata":{"finalizers":null}}'
        self.kubectl("patch", "pod", "-n", ns, pod, "--type=merge", "-p", patch, check=False)

    def ip(self, ns: str, name: str) -> str | None:
        pod = self.api.get("Pod", ns, name) or {}
        return (pod.get("status") or {}).get("podIP")

    @contextmanager
    def operators_instead(
        self, names: Sequence[str], extra: Sequence[str]
    ) -> Iterator[dict[str, OperatorProcess]]:
        """The session's operator makes way for others, one a name (its flags and `extra`,
        POD_NAME the name), and comes back after; the first stands for it meanwhile."""
        base = self.operator
        base.stop()
        others = {
            name: OperatorProcess(
                base.kubeconfig, base.log.with_name(f"operator-{name}.log"), base.ssh_port,
                extra=[*base.extra, *extra], env={"POD_NAME": name},
            )
            for name in names
        }  # fmt: skip
        self.operator = others[names[0]]
        try:
            for proc in others.values():
                proc.start()
            yield others
        finally:
            for proc in others.values():
                proc.stop()
            self.operator = base
            base.start()
