"""Kueue on the local cluster, as tests set it up: a queue per test namespace, jobs whose pods
ask for CPU (quota counts requests), and the Workloads read back."""

from __future__ import annotations

from typing import Any

import yaml

from etoperator import naming
from localcluster.manifests import job
from tests.harness import World

MILLICPU = 100  # each pod's request, unless a test says otherwise
KUEUE = "kueue.x-k8s.io/v1beta2"


def queued_job(
    name: str, queue: str = "lq", replicas: int = 2, millicpu: int = MILLICPU, **spec: Any
) -> dict[str, Any]:
    body = job(name, replicas=replicas, **spec)
    body["metadata"]["labels"] = {naming.LABEL_QUEUE: queue}
    for role in ("launcher", "worker"):
        pod = body["spec"]["etReplicaSpecs"][role]["template"]["spec"]
        pod["containers"][0]["resources"] = {"requests": {"cpu": f"{millicpu}m"}}
    return body


def make_queue(
    cluster: World,
    ns: str,
    pods: int,
    preempt: bool = False,
    labels: dict[str, str] | None = None,
    millicpu: int = MILLICPU,
) -> str:
    """A flavor, a ClusterQueue with room for `pods` pods of this namespace, and LocalQueue
    `lq`; returns the ClusterQueue's name."""
    cq = f"cq-{ns}"
    flavor: dict[str, Any] = {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                              "metadata": {"name": f"f-{ns}"}}  # fmt: skip
    if labels:
        flavor["spec"] = {"nodeLabels": labels}
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [
                    {
                        "name": f"f-{ns}",
                        "resources": [{"name": "cpu", "nominalQuota": f"{pods * millicpu}m"}],
                    }
                ],
            }
        ],
    }
    if preempt:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    docs = [
        flavor,
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": cq}, "spec": spec},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
         "spec": {"clusterQueue": cq}},
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return cq


def workloads(cluster: World, ns: str) -> list[dict[str, Any]]:
    return cluster.api.list(naming.WORKLOAD_KIND, ns)


def live_workloads(cluster: World, ns: str, job_name: str) -> list[dict[str, Any]]:
    """The job's Workloads not finished."""
    return [
        w
        for w in workloads(cluster, ns)
        if (w["metadata"].get("labels") or {}).get(naming.LABEL_JOB) == job_name
        and not any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in (w.get("status") or {}).get("conditions") or []
        )
    ]


def admitted_workers(cluster: World, ns: str, job_name: str) -> int:
    total = 0
    for w in live_workloads(cluster, ns, job_name):
        for psa in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
            if psa["name"] == "worker":
                total = max(total, int(psa.get("count") or 0))
    return total
