"""Pure: each pod as the planner sees it (role, index, phase, exit, notices, why it waits)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from etoperator import naming
from etoperator.builders import workload as wl
from etoperator.clock import parse_iso
from etoperator.planning import PodView
from etoperator.reconcile.launcherlog import said_saved

# Reasons a container waits that pass by themselves: not worth telling the user.
_TRANSIENT = ("ContainerCreating", "PodInitializing")
UNSCHEDULED = 20.0  # seconds a pod may wait for any scheduler's word before it is said


def classify(
    job: str, pods: list[dict[str, Any]], tainted: set[str], now: datetime | None = None
) -> list[PodView]:
    """Pure: each pod's role, index, phase, exit and notices; readiness is settled later."""
    views = []
    for p in pods:
        meta, pst = p["metadata"], p.get("status") or {}
        role = (meta.get("labels") or {}).get(naming.LABEL_ROLE, "")
        worker = role == naming.ROLE_WORKER
        code, term_reason = _container_exit(p)
        run = (meta.get("annotations") or {}).get(naming.ANN_RUN)
        made = parse_iso(str(meta.get("creationTimestamp") or ""))
        age = (now - made).total_seconds() if made and now else None
        views.append(
            PodView(
                name=meta["name"],
                role=role,
                index=naming.worker_index(job, meta["name"]) if worker else None,
                phase=pst.get("phase") or "Pending",
                deleting=bool(meta.get("deletionTimestamp")),
                exit_code=code,
                reason=str(pst.get("reason") or term_reason),
                run=int(run) if run is not None and str(run).isdigit() else None,
                leaving=_leaving(p, tainted) if worker else "",
                waiting=_waiting(pst) or _unscheduled(p, age),
                ip=str(pst.get("podIP") or ""),
                bound=bool((p.get("spec") or {}).get("nodeName")),
                surplus=worker and wl.LABEL_SURPLUS in (meta.get("labels") or {}),
                saved="" if worker else said_saved(p),
                age=age,
                uid=str(meta.get("uid") or ""),
            )
        )
    return views


def _container_exit(pod: dict[str, Any]) -> tuple[int | None, str]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term.get("exitCode"), str(term.get("reason") or "")
    return None, ""


def _leaving(pod: dict[str, Any], tainted_nodes: set[str]) -> str:
    """Why this pod is about to be taken away, or '' when nothing says so."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f"DisruptionTarget: {cond.get('reason') or 'disruption'}"
    node = (pod.get("spec") or {}).get("nodeName")
    if node and node in tainted_nodes:
        return f"node {node} is tainted for termination"
    return ""


def _waiting(pst: dict[str, Any]) -> str:
    """Why a pod that is not running cannot run, in the words of the scheduler or the kubelet
    ("" when it says nothing, or only that it is on its way)."""
    if (pst.get("phase") or "Pending") != "Pending":
        return ""
    for c in pst.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason') or 'NotScheduled'}: {c.get('message') or ''}".rstrip(": ")
    for cs in pst.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in _TRANSIENT:
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    return ""


def _unscheduled(pod: dict[str, Any], age: float | None) -> str:
    """A pod no scheduler has taken up (no PodScheduled condition at all) UNSCHEDULED seconds
    after it was made: its schedulerName names no scheduler that runs (the pod itself never
    says so)."""
    spec, pst = pod.get("spec") or {}, pod.get("status") or {}
    if (
        age is None
        or age < UNSCHEDULED
        or spec.get("nodeName")
        or pst.get("phase", "Pending") != "Pending"
        or any(c.get("type") == "PodScheduled" for c in pst.get("conditions") or [])
    ):
        return ""
    name = spec.get("schedulerName") or "default-scheduler"
    return f"NoScheduler: no scheduler has taken it up in {age:.0f}s (schedulerName {name})"
