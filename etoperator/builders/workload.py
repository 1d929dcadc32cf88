"""Kueue's Workload for a queued job: what it asks the queue for (pure)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders.common import Owner

LAUNCHER_SET = "launcher"
WORKER_SET = "worker"
ELASTIC = "kueue.x-k8s.io/elastic-job"
SLICE_NAME = "kueue.x-k8s.io/workload-slice-name"
REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"


@dataclass(frozen=True)
class Priority:
    """A WorkloadPriorityClass: its name and value."""

    name: str
    value: int


def pod_set_template(template: dict[str, Any]) -> dict[str, Any]:
    """A pod set's template: the job's, without the queue label (pods are never queued
    apart from their job)."""
    out = copy.deepcopy(template)
    labels = (out.get("metadata") or {}).get("labels") or {}
    labels.pop(naming.LABEL_QUEUE, None)
    return out


def workload(
    job_spec: JobSpec,
    owner: Owner,
    name: str,
    workers: int,
    priority: Priority | None = None,
    replacing: str | None = None,
) -> dict[str, Any]:
    """The Workload `name` asking for the launcher and `workers` workers: down to minReplicas
    for a first admission (partial admission), all of them for a slice that grows the job
    (`replacing`: the Workload it replaces once admitted)."""
    worker_set: dict[str, Any] = {
        "name": WORKER_SET,
        "count": workers,
        "template": pod_set_template(job_spec.worker.template),
    }
    # Partial admission down to minReplicas; a gang job's never below its gang (fewer workers
    # would hold quota for a gang the scheduler can never place).
    least = job_spec.worker.min_replicas
    if job_spec.gang is not None:
        least = max(least, job_spec.gang.min_available)
    if replacing is None and least < workers:
        worker_set["minCount"] = least
    spec: dict[str, Any] = {
        "queueName": job_spec.queue,
        "podSets": [
            {
                "name": LAUNCHER_SET,
                "count": 1,
                "template": pod_set_template(job_spec.launcher.template),
            },
            worker_set,
        ],
    }
    if priority is not None:
        spec["priorityClassRef"] = {
            "group": naming.KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority.name,
        }
        spec["priority"] = priority.value
    base = naming.workload_name(job_spec.name, job_spec.uid)
    annotations = {ELASTIC: "true", SLICE_NAME: base}
    if replacing is not None:
        annotations[REPLACES] = f"{job_spec.namespace}/{replacing}"
    labels = {**naming.job_labels(job_spec.name), naming.KUEUE_JOB_UID: job_spec.uid}
    return {
        "apiVersion": f"{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}",
        "kind": naming.WORKLOAD_KIND,
        "metadata": {
            "name": name,
            "namespace": job_spec.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner.reference()],
        },
        "spec": spec,
    }
