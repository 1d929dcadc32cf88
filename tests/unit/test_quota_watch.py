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


def test_a_deleted_job_s_terminating_pods_are_outside_kueue_s_account() -> None:
    pods = [pod("gone", "100m", deleting=True), pod("live", "100m", deleting=True),
            pod("live", "200m"), pod("live", "400m", phase="Succeeded")]  # fmt: skip
    assert pods_request(pods, {"live"}) == 300  # the live job's, terminating or not
    assert pods_request(pods) == 400  # without Workloads read: every pod that has not ended
    # a pod of a job without a Workload that is not being deleted still counts
    assert pods_request([pod("gone", "100m")], set()) == 100
