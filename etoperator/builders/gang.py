"""Gang scheduling through Kubernetes' Workload API (scheduling.k8s.io/v1alpha2): the job's
Workload, holding the workers' pod group template, and the PodGroup its workers join (pure)."""

from __future__ import annotations

from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders.common import Owner, metadata

API = f"{naming.SCHEDULING_GROUP}/{naming.SCHEDULING_VERSION}"


def policy(job_spec: JobSpec) -> dict[str, Any]:
    assert job_spec.gang is not None
    return {"gang": {"minCount": job_spec.gang.min_available}}


def workload(job_spec: JobSpec, owner: Owner) -> dict[str, Any]:
    """The job's Workload: one pod group template, the workers', all or nothing at
    minAvailable."""
    template: dict[str, Any] = {"name": naming.GANG_TEMPLATE, "schedulingPolicy": policy(job_spec)}
    assert job_spec.gang is not None
    if job_spec.gang.priority_class:
        template["priorityClassName"] = job_spec.gang.priority_class
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": metadata(
            job_spec.name, job_spec.namespace, owner, naming.job_labels(job_spec.name)
        ),
        "spec": {
            "controllerRef": {
                "apiGroup": naming.GROUP,
                "kind": naming.JOB_KIND,
                "name": job_spec.name,
            },
            "podGroupTemplates": [template],
        },
    }


def pod_group(job_spec: JobSpec, owner: Owner) -> dict[str, Any]:
    """The workers' PodGroup, made from the Workload's template."""
    assert job_spec.gang is not None
    spec: dict[str, Any] = {
        "podGroupTemplateRef": {
            "workload": {
                "workloadName": job_spec.name,
                "podGroupTemplateName": naming.GANG_TEMPLATE,
            }
        },
        "schedulingPolicy": policy(job_spec),
    }
    if job_spec.gang.priority_class:
        spec["priorityClassName"] = job_spec.gang.priority_class
    return {
        "apiVersion": API,
        "kind": naming.POD_GROUP_KIND,
        "metadata": metadata(
            naming.pod_group_name(job_spec.name),
            job_spec.namespace,
            owner,
            naming.job_labels(job_spec.name),
        ),
        "spec": spec,
    }


def place(job_spec: JobSpec, spec: dict[str, Any], worker: bool) -> None:
    """A pod of a gang job: workers join the PodGroup; every pod gets the policy's priority
    class and scheduler unless its template names its own."""
    gang = job_spec.gang
    if gang is None:
        return
    if worker:
        spec["schedulingGroup"] = {"podGroupName": naming.pod_group_name(job_spec.name)}
    if gang.priority_class:
        spec.setdefault("priorityClassName", gang.priority_class)
    if gang.scheduler_name:
        spec.setdefault("schedulerName", gang.scheduler_name)
