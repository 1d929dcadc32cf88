"""Kueue's Workload for a queued job: what it asks the queue for (pure)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
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
SURPLUS = "-surplus"  # the surplus family's slice name: the core's with this suffix
SURPLUS_SET = "surplus"  # the placement key of workers made under the surplus's admission
LABEL_SURPLUS = f"{naming.ANN_PREFIX}/surplus"  # on those workers' pods


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


def admitted_under(pod: dict[str, Any], surplus: bool) -> dict[str, Any]:
    """A worker's pod, labelled when it runs under the surplus's admission (what Kueue takes
    back first)."""
    if surplus:
        pod["metadata"].setdefault("labels", {})[LABEL_SURPLUS] = "true"
    return pod


def core_workers(job_spec: JobSpec) -> int:
    """The workers a queued job cannot run without: minReplicas, a gang job's never below its
    gang (fewer would hold quota for a gang the scheduler can never place)."""
    least = job_spec.worker.min_replicas
    if job_spec.gang is not None:
        least = max(least, job_spec.gang.min_available)
    return min(least, job_spec.worker.replicas)


def is_surplus(body: dict[str, Any]) -> bool:
    """A Workload of the job's surplus family."""
    return str((body["metadata"].get("annotations") or {}).get(SLICE_NAME, "")).endswith(SURPLUS)


def surplus_name(job_spec: JobSpec) -> str:
    return naming.workload_name(job_spec.name, job_spec.uid) + SURPLUS


def priority_of(priority: Priority | None, surplus: bool) -> dict[str, Any]:
    """A core Workload's priority is its class's; a surplus one is one lower, with no class
    (its value would be written over the lower one)."""
    if surplus:
        return {"priority": (priority.value if priority is not None else 0) - 1}
    if priority is None:
        return {}
    ref = {"group": naming.KUEUE_GROUP, "kind": "WorkloadPriorityClass", "name": priority.name}
    return {"priorityClassRef": ref, "priority": priority.value}


def workload(
    job_spec: JobSpec,
    owner: Owner,
    name: str,
    workers: int,
    priority: Priority | None = None,
    replacing: str | None = None,
    surplus: bool = False,
) -> dict[str, Any]:
    """The Workload `name`: the core (the launcher and `workers` workers) or, `surplus`, the
    workers above it only, one priority lower (what a preemption takes first), each worker
    admitted on its own (minCount 1) unless it grows the job for a scaler (`replacing`: the
    Workload it replaces once admitted, or "": a new surplus asked whole)."""
    worker_set: dict[str, Any] = {
        "name": WORKER_SET,
        "count": workers,
        "template": pod_set_template(job_spec.worker.template),
    }
    least = 1 if surplus else core_workers(job_spec)
    if replacing is None and least < workers:
        worker_set["minCount"] = least
    launcher = {
        "name": LAUNCHER_SET,
        "count": 1,
        "template": pod_set_template(job_spec.launcher.template),
    }
    spec: dict[str, Any] = {
        "queueName": job_spec.queue,
        "podSets": [worker_set] if surplus else [launcher, worker_set],
        **priority_of(priority, surplus),
    }
    base = naming.workload_name(job_spec.name, job_spec.uid)
    annotations = {ELASTIC: "true", SLICE_NAME: base + (SURPLUS if surplus else "")}
    if replacing:
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


def owned_by_pods(job: Owner, pods: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The patch that makes a Workload owned by the job (its controller) and by its pods
    (name, uid): deleted with the job, the garbage collector keeps it, and Kueue its quota,
    until the last of them is gone. The list is replaced whole."""
    refs = [job.reference()]
    refs += [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid} for name, uid in pods]
    return {"metadata": {"ownerReferences": refs}}
