"""The wire of kube.py's requests: each kind's path, the apiserver's answers turned into
values (404 and 409 here, every other refusal an ApiError), and the bodies of an Event and
of an exec's end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as TransportError

from etoperator import clock, naming

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# kind -> (path prefix, plural)
RESOURCES: dict[str, tuple[str, str]] = {
    "Pod": ("api/v1", "pods"),
    "Service": ("api/v1", "services"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Secret": ("api/v1", "secrets"),
    "PersistentVolumeClaim": ("api/v1", "persistentvolumeclaims"),
    "ServiceAccount": ("api/v1", "serviceaccounts"),
    "Event": ("api/v1", "events"),
    "Role": ("apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Lease": ("apis/coordination.k8s.io/v1", "leases"),
    naming.JOB_KIND: (f"apis/{naming.API_VERSION}", naming.JOB_PLURAL),
    naming.SCALEOUT_KIND: (f"apis/{naming.API_VERSION}", naming.SCALEOUT_PLURAL),
    naming.SCALEIN_KIND: (f"apis/{naming.API_VERSION}", naming.SCALEIN_PLURAL),
    naming.WORKLOAD_KIND: (f"apis/{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}", "workloads"),
    naming.POD_GROUP_KIND: (
        f"apis/{naming.SCHEDULING_GROUP}/{naming.SCHEDULING_VERSION}",
        "podgroups",
    ),
    naming.GANG_WORKLOAD: (
        f"apis/{naming.SCHEDULING_GROUP}/{naming.SCHEDULING_VERSION}",
        "workloads",
    ),
}
# Cluster-scoped kinds read by name: kind -> (path prefix, plural).
CLUSTER_RESOURCES: dict[str, tuple[str, str]] = {
    "Node": ("api/v1", "nodes"),
    "PersistentVolume": ("api/v1", "persistentvolumes"),
    "ResourceFlavor": (f"apis/{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}", "resourceflavors"),
    "WorkloadPriorityClass": (
        f"apis/{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}",
        "workloadpriorityclasses",
    ),
}


class Conflict(Exception):
    """The object changed since it was read (409 on a write with a resourceVersion)."""


class AlreadyExists(Exception):
    """An object of that name exists already."""


class ApiError(Exception):
    """Any other refusal from the API server; the message holds its reason, `request` what was
    asked ("create Pod ns/name")."""

    def __init__(self, status: int, message: str, request: str = "") -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.request = request

    @property
    def unreachable(self) -> bool:
        """The server was not reached or did not answer (no HTTP status)."""
        return self.status == 0


class Stopped(ApiError):
    """A write not sent: this replica has stopped acting (its Lease is being handed over)."""

    def __init__(self, request: str = "") -> None:
        super().__init__(0, "not sent: this replica has stopped acting", request)


def reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


@contextmanager
def translate(request: str = "") -> Iterator[None]:
    try:
        yield
    except TransportError as exc:
        # Refused, reset or timed out: urllib3 raises these (MaxRetryError, ProtocolError, ...)
        # past its retries, and callers must see them as the API's answer, not a crash.
        raise ApiError(0, f"API server unreachable: {type(exc).__name__}", request) from None
    except ApiException as exc:
        if exc.status == 409:
            body = exc.body or ""
            if "AlreadyExists" in body or "already exists" in body:
                raise AlreadyExists(reason(exc)) from None
            raise Conflict(reason(exc)) from None
        raise ApiError(exc.status or 0, reason(exc), request) from None


def path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural = RESOURCES[kind]
    path = f"/{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


NO_ANSWER = "could not run it: no answer from the apiserver"


def exec_outcome(ended: str, output: str) -> tuple[int, str]:
    """(exit code, output) from the status the kubelet sends when an exec ends: -1 and why,
    when the command could not run at all (a file missing, not executable, an argument list
    too long), in the kubelet's words."""
    try:
        status = json.loads(ended) if ended.strip() else {}
    except ValueError:
        status = {}
    if status.get("status") == "Success":
        return 0, output
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return int(cause["message"]), output
    why = status.get("message") or "the exec ended without a status"
    return -1, f"could not run it: {why}"


def event_manifest(
    obj: dict[str, Any], etype: str, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    meta = obj.get("metadata", {})
    ts = clock.iso(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'x')}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": etype,
        "source": {"component": "etoperator"},
        "reportingComponent": "etoperator",
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "count": 1,
    }
