"""The operator without a network path to pods (`--no-ssh-checks`, e.g. run from a laptop):
a Running worker counts as ready, and the scale-in drain check goes through pods/exec."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from localcluster.kubelet import Kubelet
from tests.harness import Cluster, start_cluster, wait_for
from tests.support.manifests import job, scalein

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("nossh")
    c = start_cluster(
        tmp, lambda cp: Kubelet(cp, tmp / "kubelet", run_sshd=False), 2222, ["--no-ssh-checks"]
    )
    try:
        yield c
    finally:
        c.stop()


def test_drain_check_through_exec(remote: Cluster) -> None:
    c = remote
    ns = c.new_namespace()
    c.create(job("far", replicas=2), ns)
    wait_for(lambda: c.phase(ns, "far") == "Running", 20)
    assert c.hosts(ns, "far") == ["far-worker-0", "far-worker-1"]
    # The simulated containers share this machine: a process here is "on" the victim.
    marker = f"etoperator-exec-drain-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["bash", "-c", f"exec -a {marker} sleep 120"],
        env={**os.environ, "HOROVOD_HOSTNAME": "far-worker-1"},
    )
    try:
        c.create(scalein("shrink", "far", count=1, timeout=60), ns)
        wait_for(lambda: c.hosts(ns, "far") == ["far-worker-0"], 10, "out of the list")
        wait_for(lambda: c.condition(ns, "shrink", "Scaling", "ScaleIn"), 5)
        assert "far-worker-1" in c.pods(ns, "far", "worker")  # Horovod still on it: kept
        assert c.phase(ns, "shrink", "ScaleIn") == "Scaling"
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: c.phase(ns, "shrink", "ScaleIn") == "ScaleSucceeded", 15)
    wait_for(lambda: c.pods(ns, "far", "worker") == ["far-worker-0"], 10)
    assert c.condition(ns, "shrink", "DrainTimeout", "ScaleIn") is None
