"""Hollow nodes (the benchmarks' kubemark nodes) leave nothing behind on the machine: no files,
no iptables chains (they run in the machine's own network namespace)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from localcluster.hollow import HollowNodes
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.integration


def machine_tmp() -> set[str]:
    """What kubemark would leave in the machine's temporary directory: a directory per node
    (tens of MB each) and the fake runtime's sockets."""
    tmp = Path(tempfile.gettempdir())
    return {p.name for p in (*tmp.glob("hollow-kubelet.*"), *tmp.glob("kubelet_remote_*.sock"))}


def firewall() -> list[str]:
    """The machine's iptables chains and rules, every table, both families."""
    saved = [subprocess.run([cmd], capture_output=True, text=True, check=True).stdout
             for cmd in ("iptables-save", "ip6tables-save")]  # fmt: skip
    return [line for text in saved for line in text.splitlines() if line[:1] in ":-"]


def ready(cluster: Cluster, name: str) -> bool:
    path = '{.status.conditions[?(@.type=="Ready")].status}'
    out = cluster.kubectl("get", "node", name, "-o", f"jsonpath={path}", check=False)
    return out.stdout == "True"


def scheduling_nice(pid: int) -> tuple[int, set[int]]:
    """The nice of the process's scheduling group (its session's autogroup, where the kernel
    has them: nice within it counts only against its own session) and of each of its threads."""
    group = Path(f"/proc/{pid}/autogroup")
    shared = int(group.read_text().split()[-1]) if group.exists() else 19
    threads = {int((t / "stat").read_text().rsplit(")", 1)[1].split()[16])
               for t in Path(f"/proc/{pid}/task").iterdir()}  # fmt: skip
    return shared, threads


def test_hollow_nodes_take_only_the_cpu_the_control_plane_leaves(
    cluster: Cluster, tmp_path: Path
) -> None:
    """They stand in for other machines: on 2 shared cores the apiserver must come first."""
    nodes = HollowNodes(tmp_path / "hollow", 1).start(cluster.cp)
    try:
        wait_for(lambda: ready(cluster, HollowNodes.name(0)), 60, "the hollow node Ready")
        assert scheduling_nice(nodes.procs[0].pid) == (19, {19})
    finally:
        nodes.stop()
        cluster.kubectl("delete", "node", HollowNodes.name(0), "--wait=false", check=False)


def test_a_hollow_node_leaves_no_files_behind(cluster: Cluster, tmp_path: Path) -> None:
    before, rules = machine_tmp(), firewall()
    nodes = HollowNodes(tmp_path / "hollow", 1).start(cluster.cp)
    try:
        wait_for(lambda: ready(cluster, HollowNodes.name(0)), 60, "the hollow node Ready")
    finally:
        nodes.stop()
        cluster.kubectl("delete", "node", HollowNodes.name(0), "--wait=false", check=False)
    assert machine_tmp() - before == set()
    assert firewall() == rules
