"""The only module that makes the operator's requests to the API server (kopf opens the watches,
handlers.py). 404 and 409 are turned into values here."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from etoperator.apiwire import (  # the names the rest of the code uses, re-exported
    CLUSTER_RESOURCES,
    MERGE,
    RESOURCES,
    translate,
)
from etoperator.apiwire import JSON_PATCH as JSON_PATCH
from etoperator.apiwire import NO_ANSWER as NO_ANSWER
from etoperator.apiwire import AlreadyExists as AlreadyExists
from etoperator.apiwire import ApiError as ApiError
from etoperator.apiwire import Conflict as Conflict
from etoperator.apiwire import Stopped as Stopped
from etoperator.apiwire import event_manifest as event_manifest
from etoperator.apiwire import exec_outcome as exec_outcome
from etoperator.apiwire import (
    path as kind_path,
)

log = logging.getLogger(__name__)


@dataclass
class WriteGate:
    """Writes pass while it is open. Closed, no new write starts: a replica that stops acting
    hands its Lease over once the writes already sent have ended, not after its passes in
    flight (an SSH probe of a dying worker can take 10 s); a pass cut short between two writes
    is what a crash there is, and the next leader's pass picks it up."""

    _open: bool = True
    _sent: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @contextmanager
    def write(self, request: str) -> Iterator[None]:
        with self._cond:
            if not self._open:
                raise Stopped(request)
            self._sent += 1
        try:
            yield
        finally:
            with self._cond:
                self._sent -= 1
                self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """No new write from now on; wait up to `timeout` for those sent. Whether all ended."""
        with self._cond:
            self._open = False
            return self._cond.wait_for(lambda: self._sent == 0, timeout)


def load_config(
    kubeconfig: str | None = None,
    context: str | None = None,
    connections: int = 32,
    retries: int | None = None,
) -> k8s.ApiClient:
    """An API client from a kubeconfig, or from the in-cluster service account. `connections`
    should cover the threads that share it: past the pool, every request is a new TLS
    handshake. `retries`: how often a request that failed in transport (refused, reset, timed
    out) is sent again before it raises; the library's default (3) when None."""
    if kubeconfig or context:
        k8s_config.load_kube_config(config_file=kubeconfig, context=context)
    else:
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()
    cfg = k8s.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = connections
    if retries is not None:
        cfg.retries = retries
    return k8s.ApiClient(cfg)


@dataclass
class Kube:
    api: k8s.ApiClient
    requests: int = 0  # counted for the benchmark's "requests per minute"
    gate: WriteGate = field(default_factory=WriteGate)  # every request but a GET passes it

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        name = (body or {}).get("metadata", {}).get("name") if method == "POST" else None
        request = f"{method} {path}" + (f" ({name})" if name else "")
        if method == "GET":
            return self._send(method, path, request, body, query, content_type, timeout)
        with self.gate.write(request):
            return self._send(method, path, request, body, query, content_type, timeout)

    def _send(
        self,
        method: str,
        path: str,
        request: str,
        body: Any,
        query: list[tuple[str, Any]] | None,
        content_type: str,
        timeout: float,
    ) -> Any:
        self.requests += 1
        headers = {"Accept": "application/json", "Content-Type": content_type}
        with translate(request):
            if hasattr(self.api, "param_serialize"):  # kubernetes >= 31
                m, url, hdrs, raw, post = self.api.param_serialize(
                    method=method,
                    resource_path=path,
                    query_params=query or [],
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                )
                resp = self.api.call_api(
                    m, url, header_params=hdrs, body=raw, post_params=post, _request_timeout=timeout
                )
                resp.read()
                if not 200 <= resp.status < 300:
                    raise ApiException(
                        status=resp.status,
                        reason=resp.reason,
                        body=resp.data.decode(errors="replace"),
                    )
            else:
                resp = self.api.call_api(
                    path,
                    method,
                    query_params=query or [],
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=timeout,
                )
        data = resp.data
        return json.loads(data) if data else None

    def get(
        self, kind: str, namespace: str, name: str, timeout: float = 30
    ) -> dict[str, Any] | None:
        try:
            return dict(self._call("GET", kind_path(kind, namespace, name), timeout=timeout))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def get_cluster(self, kind: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped object by name (None: not found)."""
        prefix, plural = CLUSTER_RESOURCES[kind]
        try:
            return dict(self._call("GET", f"/{prefix}/{plural}/{name}"))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def serves(self, group_version: str) -> bool:
        """Whether the apiserver serves an API group version (discovery, open to every
        authenticated user)."""
        try:
            self._call("GET", f"/apis/{group_version}")
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    def may(self, verb: str, resource: str, group: str = "") -> bool:
        """Whether this account may `verb` `resource` cluster-wide (a SelfSubjectAccessReview,
        which every authenticated user may ask). It writes nothing: not gated."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group}},
        }
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        answer = self._send("POST", path, f"POST {path}", review, None, "application/json", 10)
        return bool((answer.get("status") or {}).get("allowed"))

    def namespace_state(self, namespace: str) -> str:
        """The namespace's state: gone, terminating, live, or unknown when this operator may
        not read namespaces (an install confined to chosen namespaces)."""
        try:
            ns = self._call("GET", f"/api/v1/namespaces/{namespace}")
        except ApiError as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 403:
                return "unknown"
            raise
        deleting = ns["metadata"].get("deletionTimestamp")
        return (
            "terminating"
            if deleting or (ns.get("status") or {}).get("phase") == "Terminating"
            else "live"
        )

    def list(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        query = [("labelSelector", selector)] if selector else []
        items = self._call("GET", kind_path(kind, namespace), query=query).get("items") or []
        for item in items:  # list items carry no kind; callers rely on it
            item.setdefault("kind", kind)
        return list(items)

    def create(self, obj: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        meta = obj["metadata"]
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        kind = f"{obj['kind']}.{group}" if f"{obj['kind']}.{group}" in RESOURCES else obj["kind"]
        path = kind_path(kind, meta["namespace"])
        return dict(self._call("POST", path, body=obj, timeout=timeout))

    def delete(
        self, kind: str, namespace: str, name: str, uid: str | None = None, grace: int | None = None
    ) -> bool:
        """Delete (background propagation; `grace`: the pod's grace period, in seconds); False
        when it was gone already."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            self._call("DELETE", kind_path(kind, namespace, name), body=body)
            return True
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise

    def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        patch: Any,
        sub: str | None = None,
        content_type: str = MERGE,
        timeout: float = 30,
    ) -> dict[str, Any]:
        path = kind_path(kind, namespace, name, sub)
        return dict(
            self._call("PATCH", path, body=patch, content_type=content_type, timeout=timeout)
        )

    def pod_log(self, namespace: str, pod: str, lines: int, limit: int = 65536) -> str:
        """The last `lines` lines of the pod's first container's output (at most `limit`
        bytes); "" when it cannot be read."""
        self.requests += 1
        core = k8s.CoreV1Api(self.api)
        try:
            with translate(f"GET pods/log {namespace}/{pod}"):
                text = core.read_namespaced_pod_log(
                    pod, namespace, tail_lines=lines, limit_bytes=limit, _request_timeout=10
                )
        except ApiError as exc:
            log.debug("Pod log not read namespace=%s pod=%s error=%s", namespace, pod, exc)
            return ""
        return str(text or "")

    def exec_in_pod(
        self, namespace: str, pod: str, command: Sequence[str], timeout: float
    ) -> tuple[int, str]:
        """Run `command` (an argv list: no shell is involved) in the pod's first container."""
        from kubernetes.stream import stream
        from websocket import WebSocketException

        self.requests += 1
        # stream() swaps the client's request function while it runs: use a private client.
        core = k8s.CoreV1Api(k8s.ApiClient(self.api.configuration))
        try:
            resp = stream(
                core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=[*command],
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
                _preload_content=False,
                # v4 over WebSocket end to end: the apiserver passes it through to the kubelet,
                # which serves it natively (v5 would be translated to SPDY on the way).
                _headers={"sec-websocket-protocol": "v4.channel.k8s.io"},
            )
            resp.run_forever(timeout=timeout)
            output = resp.read_stdout() + resp.read_stderr()
            ended = resp.read_channel(3)  # the kubelet's word on how the command ended
            still = resp.is_open()
            resp.close()
        except ApiException as exc:  # refused before it ran: the status and its reason
            if not exc.status:  # the client's own: the connection failed before any answer
                return -1, f"{NO_ANSWER} ({exc.reason})"
            return -1, f"could not run it: {exc.status} {exc.reason}"
        except (WebSocketException, OSError, ValueError, TypeError) as exc:
            # TypeError: what the client raises for an argument it cannot send (a NUL byte).
            return -1, f"could not run it: {exc}"
        if still:
            return -1, f"could not run it: no end within {timeout:.0f}s"
        return exec_outcome(ended, output)

    def event(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, now: datetime
    ) -> None:
        """Post a Kubernetes Event about `obj` (never raises: events are best effort)."""
        meta = obj.get("metadata", {})
        event = event_manifest(obj, etype, reason, message, now)
        try:
            self._call("POST", kind_path("Event", meta["namespace"]), body=event)
        except (ApiError, Conflict, AlreadyExists) as exc:
            # A namespace on its way out takes no new objects: nothing to warn anyone about.
            level = logging.DEBUG if "being terminated" in str(exc) else logging.WARNING
            log.log(
                level, "Event not posted reason=%s object=%s error=%s", reason, meta.get("name"),
                exc,
            )  # fmt: skip
