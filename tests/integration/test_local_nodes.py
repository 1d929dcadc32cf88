"""The local cluster's real nodes, as the tiers above rely on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster.node import image_name
from tests.harness import Cluster, wait_for
from tests.support.manifests import IMAGE

pytestmark = pytest.mark.integration
HOST_IPAM = Path("/var/lib/cni/networks")


def run_pod(cluster: Cluster, ns: str, name: str, node: str) -> str:
    """A pod placed on `node`; its address once it runs."""
    container = {"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                 "command": ["sleep", "600"]}  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 0},
    }
    cluster.create(pod, ns)
    return str(wait_for(lambda: cluster.ip(ns, name), 30, f"{name} running"))


def host_reserved() -> set[str]:
    return {p.name for p in HOST_IPAM.glob("*/*")} if HOST_IPAM.exists() else set()


def test_each_node_hands_out_addresses_of_its_own(cluster: Cluster, ns: str) -> None:
    """Addresses come from a store per node, not this machine's /var/lib/cni shared by the
    nodes: there, a node that found the other's last address started again from the bottom of
    its range and gave a new pod the address of one just deleted, which it kept reaching at
    the deleted pod's MAC for ~40 s."""
    first, second = cluster.node_names()
    a = run_pod(cluster, ns, "a", first)
    b = run_pod(cluster, ns, "b", second)  # the other node hands out an address in between
    assert not {a, b} & host_reserved()
    cluster.api.delete("Pod", ns, "a")
    wait_for(lambda: cluster.api.get("Pod", ns, "a") is None, 30, "a gone")
    c = run_pod(cluster, ns, "c", first)
    assert c != a


def test_a_nodes_store_holds_only_the_images_it_runs(cluster: Cluster) -> None:
    """Each rebuild of the operator's image is imported under the same name, and the runtime
    kept a reference by digest to the image it replaced: a machine that rebuilt it often had
    gigabytes of them in every node's store. The replaced ones are removed at the node's start."""
    assert cluster.local.real is not None
    for node in cluster.local.real.nodes:
        refs = [line.split() for line in node.ctr("images", "ls").stdout.splitlines()[1:]]
        running = {image_name(archive) for archive in node.images}
        digests = {ref[2] for ref in refs if ref[0] in running}
        assert running <= {ref[0] for ref in refs}
        assert [ref[0] for ref in refs if ref[2] not in digests] == []
