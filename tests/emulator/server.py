"""A Kubernetes API emulator for tests: enough of the real API server for kopf, the official
client, kubectl and the operator, served over HTTPS from one asyncio thread.

What it does: discovery (/api, /apis, group versions, short names, /version); namespaces;
CRDs loaded from crds/*.yaml with schema defaults, pruning and validation (CEL subset),
printer columns as Table responses, status and scale subresources; uid, creationTimestamp,
generation, generateName, resourceVersion with 409 on stale writes and 422 on a failed JSON
patch `test`; merge, JSON and strategic-merge patches; PUT; label and field selectors on list
and watch; watch as JSON lines with resourceVersion resume, BOOKMARKs and timeoutSeconds;
finalizers and deletionTimestamp; graceful pod deletion for pods bound to a node;
ownerReference garbage collection; DELETE on collections; Events with generated names.

What it does not: authentication/authorization (any token passes), admission webhooks,
OpenAPI documents (use `kubectl --validate=false`), protobuf (JSON only), server-side apply,
field managers, pods/exec, and CEL beyond the subset in schema.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import random
import ssl
import string
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.emulator import ops, schema

log = logging.getLogger("emulator")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: list[str] = field(default_factory=list)
    singular: str = ""
    status_sub: bool = False
    scale: dict[str, str] | None = None
    schema: dict[str, Any] | None = None
    columns: list[dict[str, Any]] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    def discovery(self) -> list[dict[str, Any]]:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        out = [
            {
                "name": self.plural,
                "singularName": self.singular or self.kind.lower(),
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": verbs,
                "shortNames": self.short_names,
                "categories": self.categories,
            }
        ]
        if self.status_sub:
            out.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if self.scale:
            out.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
        return out


BUILTIN = [
    Resource(
        "", "v1", "namespaces", "Namespace", namespaced=False, short_names=["ns"], status_sub=True
    ),
    Resource("", "v1", "nodes", "Node", namespaced=False, short_names=["no"], status_sub=True),
    Resource("", "v1", "pods", "Pod", short_names=["po"], status_sub=True, categories=["all"]),
    Resource(
        "", "v1", "services", "Service", short_names=["svc"], status_sub=True, categories=["all"]
    ),
    Resource("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
    Resource("", "v1", "events", "Event", short_names=["ev"]),
    Resource("", "v1", "endpoints", "Endpoints", short_names=["ep"]),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    Resource("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
    Resource(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=["crd", "crds"],
        status_sub=True,
    ),
]


class ApiError(Exception):
    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _age(ts: str | None) -> str:
    if not ts:
        return "<unknown>"
    t = datetime.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    s = int((datetime.now(UTC) - t).total_seconds())
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    """What counts for `generation`: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _jsonpath(obj: Any, path: str) -> Any:
    cur = obj
    for part in [p for p in path.split(".") if p]:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


@dataclass
class Watcher:
    res: Resource
    namespace: str | None
    labels: Any
    fields: Any
    queue: asyncio.Queue[tuple[int, str, dict[str, Any]] | None]

    def matches(self, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        return bool(self.labels(meta.get("labels") or {}) and self.fields(obj))


class Store:
    """All objects, the event history and the watchers. Used from the server's loop only."""

    def __init__(self) -> None:
        self.rv = 100
        self.resources: dict[tuple[str, str], Resource] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self.history: list[tuple[int, tuple[str, str], str, dict[str, Any]]] = []
        self.watchers: list[Watcher] = []
        self.uids: set[str] = set()
        self.audit: dict[str, set[tuple[str, str, str]]] = {}
        self.counts: dict[str, dict[tuple[str, str, str], int]] = {}
        # (verb, resource, code): the next matching request fails with that code, once
        self.faults: list[tuple[str, str, int]] = []
        self.requests = 0
        for res in BUILTIN:
            self.add_resource(res)
        for ns in ("default", "kube-system"):
            self.create(
                self.resources[("", "namespaces")],
                None,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )

    # -- resources ---------------------------------------------------------------------------

    def add_resource(self, res: Resource) -> None:
        self.resources[res.key] = res
        self.objects.setdefault(res.key, {})

    def add_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            subs = version.get("subresources") or {}
            self.add_resource(
                Resource(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    short_names=names.get("shortNames") or [],
                    singular=names.get("singular", ""),
                    status_sub="status" in subs,
                    scale=subs.get("scale"),
                    schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                    columns=version.get("additionalPrinterColumns") or [],
                    categories=names.get("categories") or [],
                )
            )

    def find(self, group: str, version: str, plural: str) -> Resource:
        res = self.resources.get((group, plural))
        if res is None or res.version != version:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource "
                f"({group or 'core'}/{version} {plural})",
            )
        return res

    def record(self, auth: str, verb: str, res: Resource, sub: str | None) -> None:
        """Remember which verbs on which resources each bearer token used (for RBAC checks)."""
        token = auth.removeprefix("Bearer ").strip()
        resource = f"{res.plural}/{sub}" if sub else res.plural
        self.audit.setdefault(token, set()).add((verb, res.group, resource))
        counts = self.counts.setdefault(token, {})
        counts[(verb, res.group, resource)] = counts.get((verb, res.group, resource), 0) + 1

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    # -- events to watchers -----------------------------------------------------------------

    def notify(
        self, res: Resource, etype: str, obj: dict[str, Any], old: dict[str, Any] | None = None
    ) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snap = copy.deepcopy(obj)
        self.history.append((rv, res.key, etype, snap))
        if len(self.history) > 200_000:
            del self.history[:50_000]
        for w in list(self.watchers):
            if w.res.key != res.key:
                continue
            now_match = w.matches(snap)
            was_match = old is not None and w.matches(old)
            if etype == "MODIFIED" and was_match and not now_match:
                w.queue.put_nowait((rv, "DELETED", snap))
            elif etype == "MODIFIED" and now_match and not was_match:
                w.queue.put_nowait((rv, "ADDED", snap))
            elif now_match:
                w.queue.put_nowait((rv, etype, snap))

    # -- reads --------------------------------------------------------------------------------

    def get(self, res: Resource, ns: str | None, name: str) -> dict[str, Any]:
        obj = self.objects[res.key].get((ns or "", name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{res.plural}{"." + res.group if res.group else ""} "{name}" not found',
                {"name": name, "kind": res.plural},
            )
        return obj

    def list(self, res: Resource, ns: str | None, labels: Any, fields: Any) -> list[dict[str, Any]]:
        items = [
            o
            for (ons, _), o in sorted(self.objects[res.key].items())
            if (not ns or ons == ns) and labels(o["metadata"].get("labels") or {}) and fields(o)
        ]
        return items

    # -- writes -------------------------------------------------------------------------------

    def _admit(
        self, res: Resource, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Schema defaults, pruning and validation for custom resources."""
        if res.schema is not None:
            obj = schema.prune(obj, res.schema, root=True)
            obj = schema.apply_defaults(obj, res.schema)
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            problems = schema.validate(body, res.schema)
            if problems:
                name = obj["metadata"].get("name", "")
                raise ApiError(
                    422,
                    "Invalid",
                    f'{res.kind}.{res.group} "{name}" is invalid: ' + "; ".join(problems),
                    {
                        "name": name,
                        "group": res.group,
                        "kind": res.kind,
                        "causes": [
                            {"field": p.split(": ", 1)[0], "message": p.split(": ", 1)[-1]}
                            for p in problems
                        ],
                    },
                )
        if res.kind == "CustomResourceDefinition":
            self.add_crd(obj)
        if res.kind == "Secret" and "stringData" in obj:
            # The real server folds stringData into base64 data and never returns it.
            data = obj.setdefault("data", {})
            for k, v in (obj.pop("stringData") or {}).items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        return obj

    def create(self, res: Resource, ns: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            ns = ns or meta.get("namespace") or "default"
            if ("", ns) not in self.objects[("", "namespaces")]:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            ns_obj = self.objects[("", "namespaces")][("", ns)]
            if ns_obj["metadata"].get("deletionTimestamp"):
                raise ApiError(403, "Forbidden", f"namespace {ns} is being terminated")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                )
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        key = (meta.get("namespace", ""), meta["name"])
        if key in self.objects[res.key]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{res.plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": res.plural},
            )
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if res.status_sub and res.kind not in ("Namespace", "Node", "CustomResourceDefinition"):
            obj.pop("status", None)
        if res.kind == "Pod":
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            obj.setdefault("spec", {}).setdefault("terminationGracePeriodSeconds", 30)
        if res.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        obj = self._admit(res, obj, None)
        meta = obj["metadata"]
        meta.pop("deletionTimestamp", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        meta["generation"] = 1
        meta["resourceVersion"] = str(self.next_rv())
        self.objects[res.key][key] = obj
        self.uids.add(meta["uid"])
        self.notify(res, "ADDED", obj)
        refs = meta.get("ownerReferences") or []
        if refs and all(r.get("uid") not in self.uids for r in refs):
            # Every owner is gone already: the garbage collector takes the newcomer too.
            asyncio.get_event_loop().call_soon(self._collect_orphan, res, key, meta["uid"])
        return obj

    def _collect_orphan(self, res: Resource, key: tuple[str, str], uid: str) -> None:
        obj = self.objects[res.key].get(key)
        if obj is not None and obj["metadata"]["uid"] == uid:
            with contextlib.suppress(ApiError):
                self.delete(res, key[0] or None, key[1], {"propagationPolicy": "Background"})

    def replace(
        self, res: Resource, ns: str | None, name: str, new: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any]:
        old = self.get(res, ns, name)
        new = copy.deepcopy(new)
        meta = new.setdefault("metadata", {})
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {res.plural} "
                f'"{name}": the object has been modified; please apply your changes '
                "to the latest version and try again",
            )
        if sub == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status")
            if merged["status"] is None:
                merged.pop("status")
            new = merged
        elif res.status_sub:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        # Immutable bookkeeping stays the server's.
        for k in (
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if k in old["metadata"]:
                new["metadata"][k] = old["metadata"][k]
            else:
                new["metadata"].pop(k, None)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        new = self._admit(res, new, old)
        if _spec_of(new) != _spec_of(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if new == old:
            return old  # a no-op write keeps the resourceVersion, as the real server does
        new["metadata"]["resourceVersion"] = str(self.next_rv())
        key = (old["metadata"].get("namespace", ""), name)
        if old["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.objects[res.key][key] = new
            self._remove(res, key)
            return new
        self.objects[res.key][key] = new
        self.notify(res, "MODIFIED", new, old)
        return new

    def patch(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        ctype: str,
        body: Any,
        sub: str | None = None,
    ) -> dict[str, Any]:
        old = self.get(res, ns, name)
        if sub == "scale":
            return self.patch_scale(res, ns, name, ctype, body)
        try:
            if "json-patch" in ctype:
                new = ops.json_patch(old, body)
            elif "strategic-merge" in ctype:
                if res.schema is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "strategic merge patch is not supported for custom resources",
                    )
                new = ops.strategic_merge_patch(old, body)
            elif "merge-patch" in ctype:
                new = ops.merge_patch(old, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype}")
        except ops.PatchError as exc:
            raise ApiError(exc.code, "Invalid", str(exc)) from None
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "patch did not produce an object")
        # A resourceVersion in the patch is a precondition; otherwise the write is unconditional.
        if not (isinstance(body, dict) and body.get("metadata", {}).get("resourceVersion")):
            new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self.replace(res, ns, name, new, sub)

    def scale_of(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        assert res.scale is not None
        meta = obj["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": _jsonpath(obj, res.scale["specReplicasPath"]) or 0},
            "status": {
                "replicas": _jsonpath(obj, res.scale["statusReplicasPath"]) or 0,
                "selector": _jsonpath(obj, res.scale.get("labelSelectorPath", "")) or "",
            },
        }

    def patch_scale(
        self, res: Resource, ns: str | None, name: str, ctype: str, body: Any
    ) -> dict[str, Any]:
        if res.scale is None:
            raise ApiError(404, "NotFound", f"{res.plural} has no scale subresource")
        obj = self.get(res, ns, name)
        scale = self.scale_of(res, obj)
        new_scale = (
            ops.json_patch(scale, body) if "json-patch" in ctype else ops.merge_patch(scale, body)
        )
        return self.put_scale(res, ns, name, new_scale)

    def put_scale(
        self, res: Resource, ns: str | None, name: str, scale: dict[str, Any]
    ) -> dict[str, Any]:
        assert res.scale is not None
        obj = copy.deepcopy(self.get(res, ns, name))
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv and rv != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        replicas = (scale.get("spec") or {}).get("replicas")
        cur = obj
        parts = [p for p in res.scale["specReplicasPath"].split(".") if p]
        for part in parts[:-1]:
            cur = cur.setdefault(part, {})
        cur[parts[-1]] = replicas
        obj["metadata"].pop("resourceVersion", None)
        new = self.replace(res, ns, name, obj)
        return self.scale_of(res, new)

    def delete(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        options: dict[str, Any],
    ) -> dict[str, Any]:
        obj = self.get(res, ns, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                "Precondition failed: UID in precondition does not match the object",
            )
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]
        ):
            raise ApiError(409, "Conflict", "Precondition failed: resourceVersion mismatch")
        key = (obj["metadata"].get("namespace", ""), name)
        grace = options.get("gracePeriodSeconds")
        graceful = (
            res.kind == "Pod"
            and (obj.get("spec") or {}).get("nodeName")
            and (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and grace != 0
        )
        if options.get("propagationPolicy") == "Orphan":
            self._orphan(obj["metadata"]["uid"])
        if obj["metadata"].get("finalizers") or graceful or res.kind == "Namespace":
            if not obj["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(obj)
                new["metadata"]["deletionTimestamp"] = now_iso()
                if graceful:
                    period = (
                        grace
                        if grace is not None
                        else obj["spec"].get("terminationGracePeriodSeconds", 30)
                    )
                    new["metadata"]["deletionGracePeriodSeconds"] = period
                new["metadata"]["resourceVersion"] = str(self.next_rv())
                if res.kind == "Namespace":
                    new["status"] = {"phase": "Terminating"}
                self.objects[res.key][key] = new
                self.notify(res, "MODIFIED", new, obj)
                obj = new
            if res.kind == "Namespace":
                self._empty_namespace(name)
                if not obj["metadata"].get("finalizers"):
                    self._remove(res, key)
            return obj
        self._remove(res, key)
        return obj

    def _remove(self, res: Resource, key: tuple[str, str]) -> None:
        obj = self.objects[res.key].pop(key)
        self.uids.discard(obj["metadata"]["uid"])
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.next_rv())
        self.notify(res, "DELETED", obj)
        self.collect(obj["metadata"]["uid"])

    def collect(self, owner_uid: str) -> None:
        """Garbage-collect dependents of a removed owner (background propagation)."""
        for res_key, objs in list(self.objects.items()):
            res = self.resources[res_key]
            for (ons, oname), o in list(objs.items()):
                refs = o["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs):
                    try:
                        self.delete(res, ons or None, oname, {"propagationPolicy": "Background"})
                    except ApiError:
                        pass

    def _orphan(self, owner_uid: str) -> None:
        for res_key, objs in self.objects.items():
            for key, o in list(objs.items()):
                refs = o["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs):
                    new = copy.deepcopy(o)
                    new["metadata"]["ownerReferences"] = [
                        r for r in refs if r.get("uid") != owner_uid
                    ]
                    new["metadata"]["resourceVersion"] = str(self.next_rv())
                    objs[key] = new
                    self.notify(self.resources[res_key], "MODIFIED", new, o)

    def _empty_namespace(self, ns: str) -> None:
        for res_key, objs in list(self.objects.items()):
            res = self.resources[res_key]
            if not res.namespaced:
                continue
            for ons, oname in list(objs):
                if ons == ns:
                    try:
                        self.delete(res, ns, oname, {"gracePeriodSeconds": 0})
                    except ApiError:
                        pass
                    if (ons, oname) in objs:  # finalizers or graceful: force it out
                        self._remove(res, (ons, oname))


class Emulator:
    """Runs the API emulator on a loopback port in a background thread."""

    def __init__(
        self, crd_dir: Path | None = None, host: str = "127.0.0.1", bookmark_interval: float = 5.0
    ) -> None:
        self.store = Store()
        self.host = host
        self.port = 0
        self.bookmark_interval = bookmark_interval
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="api-emulator", daemon=True)
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.tls_dir: Path | None = None
        self.crd_dir = crd_dir
        # async (namespace, pod, argv) -> (exit code, stdout, stderr); set by a kubelet
        self.exec_handler: Any = None
        if crd_dir is not None:
            for path in sorted(crd_dir.glob("*.yaml")):
                for doc in yaml.safe_load_all(path.read_text()):
                    if doc and doc.get("kind") == "CustomResourceDefinition":
                        self.store.create(
                            self.store.resources[
                                ("apiextensions.k8s.io", "customresourcedefinitions")
                            ],
                            None,
                            doc,
                        )

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, tls_dir: Path) -> str:
        from tests.emulator.tls import make_cert

        self.tls_dir = tls_dir
        self.cert, self.key, self.ca = make_cert(tls_dir, self.host)
        self.thread.start()
        self._ready.wait(10)
        return self.url

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        site = web.TCPSite(self._runner, self.host, self.port or 0, ssl_context=ctx)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def stop(self) -> None:
        async def _stop() -> None:
            for w in list(self.store.watchers):
                w.queue.put_nowait(None)
            if self._runner is not None:
                await self._runner.cleanup()

        fut = asyncio.run_coroutine_threadsafe(_stop(), self.loop)
        try:
            fut.result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the emulator's loop (the store is not thread-safe)."""

        async def _do() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(_do(), self.loop).result(10)

    def kubeconfig(
        self, path: Path, namespace: str = "default", token: str = "emulator-token"
    ) -> Path:
        assert self.ca is not None
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [
                {
                    "name": "emulator",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "tester", "namespace": namespace},
                }
            ],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    # -- HTTP ---------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.store.requests += 1
        try:
            return await self._route(request)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)
        except (ValueError, KeyError, TypeError) as exc:
            log.exception("bad request %s %s", request.method, request.path)
            err = ApiError(400, "BadRequest", f"{type(exc).__name__}: {exc}")
            return web.json_response(err.status(), status=400)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["version"]:
            return web.json_response(
                {
                    "major": "1",
                    "minor": "32",
                    "gitVersion": "v1.32.0-emulator",
                    "platform": "linux/amd64",
                }
            )
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return web.Response(text="ok")
        if parts == ["api"]:
            return web.json_response(
                {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if parts == ["apis"]:
            return web.json_response(self._groups())
        if parts and parts[0] in ("openapi", "swagger.json"):
            raise ApiError(404, "NotFound", "the emulator serves no OpenAPI document")
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts and parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        elif parts and parts[0] == "apis" and len(parts) == 2:
            return web.json_response(self._group(parts[1]))
        else:
            raise ApiError(404, "NotFound", f"the server could not find {request.path}")
        if not rest:
            return web.json_response(self._resource_list(group, version))
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        res = self.store.find(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub == "exec" and res.kind == "Pod" and name:
            self.store.record(request.headers.get("Authorization", ""), "create", res, sub)
            return await self._exec(request, ns or "", name)
        if (
            sub not in (None, "status", "scale")
            or (sub == "status" and not res.status_sub)
            or (sub == "scale" and not res.scale)
        ):
            raise ApiError(404, "NotFound", f"no subresource {sub} on {res.plural}")
        return await self._verb(request, res, ns, name, sub)

    def _groups(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for res in self.store.resources.values():
            if res.group:
                groups.setdefault(res.group, [])
                if res.version not in groups[res.group]:
                    groups[res.group].append(res.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group(g) for g in sorted(groups)],
        }

    def _group(self, group: str) -> dict[str, Any]:
        versions = sorted({r.version for r in self.store.resources.values() if r.group == group})
        if not versions:
            raise ApiError(404, "NotFound", f"no group {group}")
        vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": vs,
            "preferredVersion": vs[0],
        }

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = [
            d
            for r in self.store.resources.values()
            if r.group == group and r.version == version
            for d in r.discovery()
        ]
        if not resources:
            raise ApiError(404, "NotFound", f"no group version {group}/{version}")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        if "yaml" in (request.content_type or ""):
            return yaml.safe_load(raw)
        return json.loads(raw)

    async def _verb(
        self, request: web.Request, res: Resource, ns: str | None, name: str | None, sub: str | None
    ) -> web.StreamResponse:
        q = request.query
        method = request.method
        store = self.store
        verb = self._rbac_verb(request, name)
        store.record(request.headers.get("Authorization", ""), verb, res, sub)
        resource = f"{res.plural}/{sub}" if sub else res.plural
        for fault in store.faults:
            if fault[:2] == (verb, resource):
                store.faults.remove(fault)
                raise ApiError(fault[2], "Conflict", f"injected fault on {verb} {resource}")
        if method == "GET" and name is None:
            labels = ops.label_matcher(q.get("labelSelector"))
            fields = ops.field_matcher(q.get("fieldSelector"))
            if q.get("watch") in ("1", "true", "True"):
                return await self._watch(request, res, ns, labels, fields)
            items = store.list(res, ns, labels, fields)
            if self._wants_table(request):
                return web.json_response(self._table(res, items))
            return web.json_response(
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(store.rv)},
                    "items": items,
                }
            )
        if method == "GET" and name is not None:
            if q.get("watch") in ("1", "true"):
                fields = ops.field_matcher(f"metadata.name={name}")
                return await self._watch(request, res, ns, ops.label_matcher(None), fields)
            obj = store.get(res, ns, name)
            if sub == "scale":
                return web.json_response(store.scale_of(res, obj))
            if self._wants_table(request):
                return web.json_response(self._table(res, [obj]))
            return web.json_response(obj)
        if method == "POST" and name is None:
            body = await self._body(request)
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "body must be an object")
            if res.namespaced and ns is None:
                raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
            if q.get("dryRun"):
                return web.json_response(body, status=201)
            return web.json_response(store.create(res, ns, body), status=201)
        if method == "PUT" and name is not None:
            body = await self._body(request)
            if sub == "scale":
                return web.json_response(store.put_scale(res, ns, name, body))
            return web.json_response(store.replace(res, ns, name, body, sub))
        if method == "PATCH" and name is not None:
            body = await self._body(request)
            ctype = request.headers.get("Content-Type", "")
            if "apply-patch" in ctype:
                raise ApiError(415, "UnsupportedMediaType", "server-side apply is not emulated")
            out = store.patch(res, ns, name, ctype, body, sub)
            return web.json_response(out)
        if method == "DELETE":
            body = await self._body(request) or {}
            for k in ("gracePeriodSeconds", "propagationPolicy"):
                if k in q:
                    body[k] = int(q[k]) if k == "gracePeriodSeconds" else q[k]
            if name is not None:
                obj = store.delete(res, ns, name, body)
                return web.json_response(obj)
            labels = ops.label_matcher(q.get("labelSelector"))
            fields = ops.field_matcher(q.get("fieldSelector"))
            items = store.list(res, ns, labels, fields)
            for o in items:
                store.delete(res, o["metadata"].get("namespace"), o["metadata"]["name"], body)
            return web.json_response(
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(store.rv)},
                    "items": items,
                }
            )
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed here")

    @staticmethod
    def _rbac_verb(request: web.Request, name: str | None) -> str:
        m, q = request.method, request.query
        if m == "GET":
            if q.get("watch") in ("1", "true", "True"):
                return "watch"
            return "get" if name else "list"
        if m == "DELETE" and not name:
            return "deletecollection"
        return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[m]

    async def _exec(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """pods/exec over a websocket (v4.channel.k8s.io), run by the kubelet's exec hook."""
        pod = self.store.get(self.store.resources[("", "pods")], ns, name)
        if (pod.get("status") or {}).get("phase") != "Running":
            raise ApiError(400, "BadRequest", f"pod {name} is not running")
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io", "channel.k8s.io"))
        await ws.prepare(request)
        argv = request.query.getall("command", [])
        if self.exec_handler is None:
            code, out, err = 126, b"", b"no kubelet runs commands here\n"
        else:
            code, out, err = await self.exec_handler(ns, name, argv)
        if out:
            await ws.send_bytes(b"\x01" + out)
        if err:
            await ws.send_bytes(b"\x02" + err)
        status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        if code != 0:
            status = {
                "metadata": {},
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "message": f"command terminated with non-zero exit code: {code}",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        await ws.send_bytes(b"\x03" + json.dumps(status).encode())
        await ws.close()
        return ws

    # -- watch --------------------------------------------------------------------------------

    async def _watch(
        self, request: web.Request, res: Resource, ns: str | None, labels: Any, fields: Any
    ) -> web.StreamResponse:
        q = request.query
        store = self.store
        timeout = float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") in ("1", "true")
        since = q.get("resourceVersion")
        watcher = Watcher(res, ns, labels, fields, asyncio.Queue())
        backlog: list[tuple[int, str, dict[str, Any]]] = []
        if since and since != "0":
            since_rv = int(since)
            oldest = store.history[0][0] if store.history else store.rv
            if since_rv < oldest - 1 and since_rv < store.rv:
                resp = web.StreamResponse(headers={"Content-Type": "application/json"})
                await resp.prepare(request)
                gone = ApiError(
                    410, "Expired", f"too old resource version: {since_rv} ({oldest})"
                ).status()
                await resp.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return resp
            for rv, key, etype, obj in store.history:
                if rv > since_rv and key == res.key and watcher.matches(obj):
                    backlog.append((rv, etype, obj))
        else:
            backlog = [
                (int(o["metadata"]["resourceVersion"]), "ADDED", copy.deepcopy(o))
                for o in store.list(res, ns, labels, fields)
            ]
        store.watchers.append(watcher)
        resp = web.StreamResponse(
            headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        )
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            for _, etype, obj in backlog:
                await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(
                        watcher.queue.get(), min(left, self.bookmark_interval)
                    )
                except TimeoutError:
                    if bookmarks:
                        mark = {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": res.kind,
                                "apiVersion": res.api_version,
                                "metadata": {"resourceVersion": str(store.rv)},
                            },
                        }
                        await resp.write(json.dumps(mark).encode() + b"\n")
                    continue
                if item is None:
                    break
                _, etype, obj = item
                await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            if watcher in store.watchers:
                store.watchers.remove(watcher)
        return resp

    # -- tables -------------------------------------------------------------------------------

    @staticmethod
    def _wants_table(request: web.Request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    def _table(self, res: Resource, items: Iterable[dict[str, Any]]) -> dict[str, Any]:
        cols: list[dict[str, Any]] = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "description": "Name",
                "priority": 0,
            }
        ]
        getters: list[Any] = [lambda o: o["metadata"]["name"]]
        if res.columns:
            for c in res.columns:
                cols.append(
                    {
                        "name": c["name"],
                        "type": c.get("type", "string"),
                        "format": "",
                        "description": c.get("description", ""),
                        "priority": c.get("priority", 0),
                    }
                )
                if c.get("type") == "date":
                    getters.append(lambda o, p=c["jsonPath"]: _age(_jsonpath(o, p)))
                else:
                    getters.append(lambda o, p=c["jsonPath"]: _jsonpath(o, p))
        else:
            if res.kind == "Pod":
                cols += [
                    {"name": "Ready", "type": "string"},
                    {"name": "Status", "type": "string"},
                    {"name": "Restarts", "type": "integer"},
                    {"name": "IP", "type": "string", "priority": 1},
                ]
                getters += [
                    lambda o: "1/1" if (o.get("status") or {}).get("phase") == "Running" else "0/1",
                    lambda o: (
                        "Terminating"
                        if o["metadata"].get("deletionTimestamp")
                        else (o.get("status") or {}).get("phase")
                    ),
                    lambda o: 0,
                    lambda o: (o.get("status") or {}).get("podIP", "<none>"),
                ]
            cols.append({"name": "Age", "type": "string", "format": ""})
            getters.append(lambda o: _age(o["metadata"].get("creationTimestamp")))
        rows = [
            {
                "cells": [g(o) for g in getters],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                },
            }
            for o in items
        ]
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.store.rv)},
            "columnDefinitions": cols,
            "rows": rows,
        }
