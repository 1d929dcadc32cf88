from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.kubelet import Kubelet
from tests.harness import Cluster, start_cluster

SSH_PORT = 2222


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kubeconfig", default=None, help="run the real-cluster tier against it")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not shutil.which("sshd") and not Path("/usr/sbin/sshd").exists():
        pytest.fail("OpenSSH's sshd is needed (apt-get install openssh-server; .ci/run does it)")
    tmp = tmp_path_factory.mktemp("cluster")
    # Quiet jobs are looked at every 3 s (not 60): tests see that such passes cost no request.
    c = start_cluster(
        tmp,
        lambda cp: Kubelet(cp, tmp / "kubelet", ssh_port=SSH_PORT),
        SSH_PORT,
        extra=["--resync", "3"],
    )
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = cluster.new_namespace()
    yield name
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(f"--- operator log (namespace {name}) ---\n{cluster.operator.tail(120)}")
    # Gone with its jobs (in the background): later tests share the operator with no one.
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + rep.when, rep)
