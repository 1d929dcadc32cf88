"""What the operator knows of the cluster, kept in memory from its watches.

Every kind a pass reads is a kopf index (handlers.py): kopf fills the indexes from the initial
LIST of each watch before any handler runs, then keeps them current from watch events. A pass
reads only from them (steady state costs the apiserver nothing); its writes keep their
resourceVersion preconditions, so a cache behind the server meets a 409, as a stale read
always did, and the pass is repeated.

Indexes are read in the event loop only (kopf changes them there): `observe` copies what one
pass needs into plain values that the pass, running in a worker thread, owns.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from etoperator import naming
from etoperator.api.statuses import JobStatus
from etoperator.builders.common import is_controlled_by

Body = dict[str, Any]
JobRef = tuple[str, str]  # namespace, job name
IndexView = Mapping[JobRef, Iterable[Body]]

_META = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations")
_META_MORE = ("ownerReferences", "deletionTimestamp", "creationTimestamp", "generation")


def _meta(body: Mapping[str, Any]) -> Body:
    meta = body.get("metadata") or {}
    return {k: copy.deepcopy(meta[k]) for k in (*_META, *_META_MORE) if k in meta}


def _init_messages(status: Mapping[str, Any]) -> list[Body]:
    """Of the init containers' statuses, only the termination messages there are."""
    said = []
    for cs in status.get("initContainerStatuses") or []:
        message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
        if message:
            said.append({"state": {"terminated": {"message": str(message)}}})
    return said


def slim(kind: str, body: Mapping[str, Any]) -> Body:
    """The parts of an object a pass reads: less memory for thousands of pods."""
    out: Body = {"apiVersion": body.get("apiVersion"), "kind": kind, "metadata": _meta(body)}
    if kind == "Pod":
        spec, status = body.get("spec") or {}, body.get("status") or {}
        out["spec"] = {"nodeName": spec.get("nodeName"), "schedulerName": spec.get("schedulerName")}
        wanted = ("phase", "podIP", "reason", "conditions", "containerStatuses")
        out["status"] = {k: copy.deepcopy(status[k]) for k in wanted if k in status}
        if said := _init_messages(status):  # a launcher's last-save report
            out["status"]["initContainerStatuses"] = said
    elif kind in ("ConfigMap", "Secret"):
        out["data"] = dict(body.get("data") or {})
    elif kind == "Role":
        out["rules"] = copy.deepcopy(body.get("rules") or [])
    elif kind == "Workload":  # its pod templates are the job's own: not kept twice
        spec = body.get("spec") or {}
        out["spec"] = {k: copy.deepcopy(v) for k, v in spec.items() if k != "podSets"}
        out["spec"]["podSets"] = [
            {k: v for k, v in ps.items() if k != "template"} for ps in spec.get("podSets") or []
        ]
        out["status"] = copy.deepcopy(dict(body.get("status") or {}))
    elif kind not in ("Service", "ServiceAccount", "RoleBinding"):
        out["spec"] = copy.deepcopy(dict(body.get("spec") or {}))
        out["status"] = copy.deepcopy(dict(body.get("status") or {}))
    return out


def job_of(labels: Mapping[str, str]) -> str | None:
    return labels.get(naming.LABEL_JOB)


@dataclass
class Observed:
    """One job and everything of it, as last seen."""

    job: Body
    spec: Any  # JobSpec | None (parsed by the reconciler)
    error: str | None
    pods: list[Body]
    services: list[Body]
    configmap: Body | None
    scalers: list[Body]
    secret: Body | None = None  # the job's own SSH Secret
    present: set[tuple[str, str]] = field(default_factory=set)  # (kind, name) of other children
    role: Body | None = None  # the launcher's Role
    workloads: list[Body] = field(default_factory=list)  # Kueue's, made for this job
    pod_group: Body | None = None  # its workers' PodGroup (gang scheduling)
    _status: JobStatus | None = field(default=None, repr=False)

    @property
    def status(self) -> JobStatus:
        """The job's status, parsed once (every part of a pass reads it)."""
        if self._status is None:
            self._status = JobStatus.from_dict(self.job.get("status"))
        return self._status


@dataclass
class Indexes:
    """The kopf indexes by name (see handlers.py): jobs by (ns, name), children by (ns, job
    label), scalers by (ns, selector.name)."""

    jobs: IndexView
    children: list[IndexView]  # one index per kind
    scalers: list[IndexView]

    def observe(self, namespace: str, name: str) -> Observed | None:
        ref = (namespace, name)
        job = next(iter(self.jobs.get(ref, ())), None)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return None
        job = copy.deepcopy(job)  # the pass may note its own writes on it
        uid = job["metadata"]["uid"]
        children = [
            c for index in self.children for c in index.get(ref, ()) if is_controlled_by(c, uid)
        ]
        by_kind: dict[str, list[Body]] = {}
        for c in children:
            by_kind.setdefault(c["kind"], []).append(c)
        cm_name, secret_name = naming.config_map_name(name), naming.secret_name(name)
        return Observed(
            job=job,
            spec=None,
            error=None,
            pods=by_kind.get("Pod", []),
            services=by_kind.get("Service", []),
            configmap=_named(by_kind.get("ConfigMap", []), cm_name),
            scalers=[s for index in self.scalers for s in index.get(ref, ())],
            secret=_named(by_kind.get("Secret", []), secret_name),
            present={(c["kind"], c["metadata"]["name"]) for c in children},
            role=_named(by_kind.get("Role", []), naming.launcher_sa_name(name)),
            workloads=by_kind.get("Workload", []),
            pod_group=_named(by_kind.get("PodGroup", []), naming.pod_group_name(name)),
        )


def _named(bodies: list[Body], name: str) -> Body | None:
    return next((b for b in bodies if b["metadata"]["name"] == name), None)
