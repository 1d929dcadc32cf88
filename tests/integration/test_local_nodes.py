"""The local cluster's real nodes, as the tiers above rely on them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from localcluster.manifests import IMAGE
from localcluster.nodestore import image_name
from tests.harness import Cluster, wait_for

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


def test_pods_on_different_nodes_reach_each_other_by_their_own_addresses(
    cluster: Cluster, ns: str
) -> None:
    """Horovod connects every rank to every other: workers on two nodes must reach each other,
    and each must see the other's own address (no masquerade), as in a cluster's pod network."""
    first, second = cluster.node_names()
    addresses = {"a": run_pod(cluster, ns, "a", first), "b": run_pod(cluster, ns, "b", second)}
    serve = (
        "import socket; s=socket.socket(); s.bind(('',7000)); s.listen(); c,a=s.accept(); "
        "open('/tmp/seen','w').write(a[0])"
    )
    call = "import socket,sys; socket.create_connection((sys.argv[1],7000),timeout=3).close()"
    for server, client in (("a", "b"), ("b", "a")):
        seen = connect_across(cluster, ns, server, client, addresses[server], serve, call)
        assert seen == addresses[client], f"{server} saw {seen!r}, not {client}'s own address"


def connect_across(
    cluster: Cluster, ns: str, server: str, client: str, address: str, serve: str, call: str
) -> str:
    """`client` connects to `server`'s listener; the address `server` saw it come from."""
    cluster.exec(ns, server, "sh", "-c", f'nohup python3 -c "{serve}" >/dev/null 2>&1 &')
    wait_for(
        lambda: cluster.exec(ns, client, "python3", "-c", call, address, check=False).returncode
        == 0,
        20, f"{client} reaching {server} across nodes", interval=0.2,
    )  # fmt: skip
    seen = wait_for(
        lambda: cluster.exec(ns, server, "cat", "/tmp/seen", check=False).stdout.strip(),
        10,
        f"{server} telling whom it saw",
    )
    return str(seen)


def test_a_nodes_store_keeps_image_layers_unpacked_only(cluster: Cluster) -> None:
    """The packed layers are dropped once unpacked: each store held the training image twice
    (12 GB a node, two nodes a test run, one more a demo)."""
    assert cluster.local.real is not None
    for node in cluster.local.real.nodes:
        blobs = node.store_root / "io.containerd.content.v1.content" / "blobs"
        packed = sum(f.stat().st_size for f in blobs.rglob("*") if f.is_file())
        assert packed < 50 * 2**20, f"{node.name}: {packed / 2**30:.1f} GiB of packed layers"


def test_the_nodes_stores_share_the_image_layers(cluster: Cluster) -> None:
    """A node's new store is made from a seed store by hard links: the training image was
    imported again into each node of each cluster slot (two minutes and 6 GB each)."""
    assert cluster.local.real is not None
    largest = [
        largest_file(node.store_root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots")
        for node in cluster.local.real.nodes
    ]
    inodes = {st.st_ino for st in largest}
    assert len(inodes) == 1 and all(st.st_nlink >= 2 for st in largest), largest


def largest_file(root: Path) -> os.stat_result:
    """The largest regular file under `root` (a layer's), whatever containers come and go."""
    best: os.stat_result | None = None
    for top, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:  # a container's own layer, gone meanwhile
                continue
            if stat.S_ISREG(st.st_mode) and (best is None or st.st_size > best.st_size):
                best = st
    assert best is not None, f"no file under {root}"
    return best
