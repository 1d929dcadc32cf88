"""The operator without a network path to pods (`--no-ssh-checks`, e.g. run from a laptop):
a Running worker counts as ready, and the scale-in drain check goes through pods/exec."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster.manifests import job, scalein
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def remote(cluster: Cluster) -> Iterator[Cluster]:
    """The session's operator makes way for one that never opens an SSH connection."""
    with cluster.operators_instead(["nossh"], ["--no-ssh-checks"]):
        yield cluster


def test_drain_check_through_exec(remote: Cluster, ns: str) -> None:
    c = remote
    c.create(job("far", replicas=2), ns)
    wait_for(lambda: c.phase(ns, "far") == "Running", 30)
    assert c.hosts(ns, "far") == ["far-worker-0", "far-worker-1"]
    # A process on the victim, as Horovod starts one there.
    busy = "HOROVOD_HOSTNAME=far-worker-1 nohup sleep 120 >/dev/null 2>&1 & echo $! > /tmp/busy"
    c.exec(ns, "far-worker-1", "sh", "-c", busy)
    c.create(scalein("shrink", "far", count=1, timeout=60), ns)
    wait_for(lambda: c.hosts(ns, "far") == ["far-worker-0"], 10, "out of the list")
    wait_for(lambda: c.condition(ns, "shrink", "Scaling", "ScaleIn"), 5)
    assert "far-worker-1" in c.pods(ns, "far", "worker")  # Horovod still on it: kept
    assert c.phase(ns, "shrink", "ScaleIn") == "Scaling"
    c.exec(ns, "far-worker-1", "sh", "-c", 'kill "$(cat /tmp/busy)"')
    wait_for(lambda: c.phase(ns, "shrink", "ScaleIn") == "ScaleSucceeded", 15)
    wait_for(lambda: c.pods(ns, "far", "worker") == ["far-worker-0"], 10)
    assert c.condition(ns, "shrink", "DrainTimeout", "ScaleIn") is None
