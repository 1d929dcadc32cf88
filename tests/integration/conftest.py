from __future__ import annotations

from collections.abc import Iterator

import pytest

from etoperator import naming
from tests.conftest import real_nodes_missing
from tests.harness import Cluster, start_cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two real nodes (one test needs a pod on a node of its own), Kueue, and the operator. One
    per worker process of the suite (tests/conftest.py), each in a slot of its own."""
    why = real_nodes_missing()
    if why:
        pytest.fail(why)
    # Quiet jobs are looked at every 3 s (not 60): tests see that such passes cost no request.
    c = start_cluster(
        tmp_path_factory.mktemp("cluster"), nodes=2, extra=["--resync", "3"], kueue=True
    )
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    # Through the fault proxy only for the tests marked `faults` (those that inject them).
    cluster.route(request.node.get_closest_marker("faults") is not None)
    name = cluster.new_namespace()
    since = cluster.operator.logged()  # earlier tests' restarts would fill the tail
    yield name
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        log = cluster.operator.tail(120, name, since)
        print(f"--- operator log (namespace {name}, this test) ---\n{log}")
        pods = cluster.kubectl("get", "pods", "-n", name, "-o", "wide", check=False).stdout
        events = cluster.kubectl("get", "events", "-n", name, check=False).stdout
        print(f"--- pods ---\n{pods}--- events ---\n{events}")
        # What the training said: Horovod's driver and rank 0 print in the launcher's log.
        launchers = f"{naming.LABEL_ROLE}={naming.ROLE_LAUNCHER}"
        said = cluster.kubectl("logs", "-n", name, "-l", launchers, "--tail=60", "--prefix",
                               check=False).stdout  # fmt: skip
        print(f"--- launchers' last lines ---\n{said}")
    cluster.release()  # a test that failed while holding pods must not hold the next one's
    # Nor leave a fault armed or the operator down: one test killed it after it had failed
    # (its crash still armed), and every later test of its half waited on no operator.
    crash = cluster.fault_proxy.disarm()
    cluster.fault_proxy.clear()
    if crash is not None and crash.fired:
        crash.killed.wait(30)
    if not cluster.operator.alive():
        print("--- the operator was down after the test: started again ---")
        cluster.operator.start()
    # Gone with its jobs (in the background): later tests share the operator with no one.
    cluster.delete_namespace(name)
