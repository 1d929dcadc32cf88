"""Real nodes for the local cluster: the network, cluster DNS and N nodes (node.py), started in
that order and stopped in the reverse one, with this machine's settings put back."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import procs
from localcluster.controlplane import ROOT, ControlPlane
from localcluster.dns import RBAC as DNS_RBAC
from localcluster.dns import ClusterDNS
from localcluster.network import Network
from localcluster.node import NodeBins, RealNode, save_sysctls

BUILD_NODE = ROOT / "hack" / "build-node.sh"
CACHE = Path(
    os.environ.get("ETOPERATOR_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "etoperator"
)
# containerd's image stores, one per slot and node (two clusters never share one): kept.
STORES = CACHE / "containerd"
BUILD_IMAGES = ROOT / "hack" / "build-images.sh"
# The apiserver's kubelet client may use the whole kubelet API (logs, exec, port-forward).
KUBELET_API_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "etoperator-local:apiserver-kubelet-api"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
"""


def node_binaries() -> Path:
    env = os.environ.get("ETOPERATOR_NODE_BIN")
    return Path(env) if env else procs.built(BUILD_NODE)


def image_archives(node_bin: Path) -> list[Path]:
    """The docker-archives of the pause, training and operator images (built if missing)."""
    out = procs.built(BUILD_IMAGES, str(node_bin))
    drop_replaced_builds()
    return [Path(line) for line in (out / "current").read_text().split()]


def drop_replaced_builds() -> None:
    """buildah keeps the image each rebuild of the operator's image replaced (untagged, about
    200 MB of its own each); the archives hold what the nodes run. Those go; the layer cache
    of the builds stays (what it no longer serves goes at a later call)."""
    found = subprocess.run(
        ["buildah", "images", "--filter", "dangling=true", "--noheading", "--format", "{{.ID}}"],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    if found:
        subprocess.run(["buildah", "rmi", *found], capture_output=True)


@dataclass
class Nodes:
    dir: Path
    count: int = 1
    net: Network | None = None
    dns: ClusterDNS | None = None
    nodes: list[RealNode] = field(default_factory=list)

    def network(self, slot: int) -> Network:
        """Made first: the apiserver listens on its gateway."""
        self.net = Network(slot).create()
        return self.net

    def start(self, cp: ControlPlane, apply: Callable[[str], object]) -> Nodes:
        """DNS and the nodes; `apply` applies a manifest as the cluster's admin."""
        assert self.net is not None
        apply(KUBELET_API_RBAC + "---" + DNS_RBAC)
        node_bin = node_binaries()
        bins = NodeBins(kube=cp.bin, node=node_bin)
        images = image_archives(node_bin)
        self.dns = ClusterDNS(cp, node_bin / "coredns", self.net.gateway, self.dir / "dns")
        self.dns.start()
        save_sysctls()
        for n in range(1, self.count + 1):
            node = RealNode(
                f"node-{n}", n, self.net, cp, bins, self.dir / f"node-{n}",
                self.net.gateway, images, store=STORES / f"{self.net.netns(n)}",
            )  # fmt: skip
            self.nodes.append(node)
            node.start()
        return self

    def node_of(self, node_name: str) -> RealNode:
        return next(n for n in self.nodes if n.name == node_name)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        if self.dns is not None:
            self.dns.stop()


def wait_ready(kubectl: Callable[..., str], count: int, timeout: float = 60) -> None:
    """`count` nodes Ready, without the not-ready taint (the node lifecycle controller's)."""

    def ready() -> bool:
        out = kubectl("get", "nodes", "-o",
                  "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{' '}"
                  "{.spec.taints}{'\\n'}{end}", check=False)  # fmt: skip
        lines = [line for line in str(out).splitlines() if line.strip()]
        return len(lines) == count and all(
            line.startswith("True") and "not-ready" not in line for line in lines
        )

    procs.wait_until(ready, f"{count} node(s) Ready", timeout)
