"""The real-cluster tier: the full-chain scenario against any cluster.

    pytest tests/cluster --kubeconfig ~/.kube/config

Needs etoperator running in the cluster (kubectl apply -k deploy/) and the training image
(examples/Dockerfile.train) pullable as etoperator/train:latest. Skipped without --kubeconfig.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.tour import JOB, Tour

pytestmark = pytest.mark.cluster


@pytest.fixture
def kube(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    kubeconfig = request.config.getoption("--kubeconfig")
    if not kubeconfig:
        pytest.skip("real-cluster tier: pass --kubeconfig")
    ns = f"etoperator-e2e-{uuid.uuid4().hex[:6]}"
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "create", "namespace", ns], check=True)
    try:
        yield kubeconfig, ns
    finally:
        subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "delete", "namespace", ns, "--wait=false"],
            check=False,
        )


def test_elastic_training_on_a_real_cluster(kube: tuple[str, str]) -> None:
    kubeconfig, ns = kube

    def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "-n", ns, *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def status(kind: str, name: str) -> dict[str, Any]:
        out = kubectl("get", kind, name, "-o", "json", check=False)
        if out.returncode != 0:
            return {}
        return dict(json.loads(out.stdout).get("status") or {})

    Tour(
        kubectl=kubectl,
        launcher_log=lambda: kubectl("logs", f"{JOB}-launcher", check=False).stdout,
        # The worker's sshd (PID 1, which ignores SIGKILL from inside) stops: the container and
        # every training process in it die at once.
        kill_worker=lambda name: kubectl("exec", name, "--", "kill", "-TERM", "1", check=False),
        status=status,
        slow=3.0,
    ).run()
