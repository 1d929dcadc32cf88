"""What the quota watch counts of the pods (localcluster/queues.py): as Kueue accounts them."""

from __future__ import annotations

from typing import Any

from etoperator import naming
from localcluster.queues import pods_request


def pod(job: str, cpu: str, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{job}-x", "labels": {naming.LABEL_JOB: job}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    container = {"name": "c", "resources": {"requests": {"cpu": cpu}}}
    return {"metadata": meta, "spec": {"containers": [container]}, "status": {"phase": phase}}


def test_every_pod_that_has_not_ended_counts_a_deleted_job_s_too() -> None:
    """A deleted job's Workloads stay until its pods are gone (they are owned by them): its
    terminating pods are within Kueue's account, not outside it."""
    pods = [pod("gone", "100m", deleting=True), pod("live", "100m", deleting=True),
            pod("live", "200m"), pod("live", "400m", phase="Succeeded"),
            pod("live", "800m", phase="Failed")]  # fmt: skip
    assert pods_request(pods) == 400
