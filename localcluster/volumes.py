"""Pod volumes as a kubelet makes them: Secret, ConfigMap, projected (service-account token from
TokenRequest, the cluster CA, the namespace) and emptyDir, written to a per-pod directory."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.apiclient import ApiStatus, AsyncApi

Files = dict[str, tuple[bytes, int]]


class VolumeNotReady(Exception):
    """A volume's source does not exist (yet): the pod stays Pending, as on a real node."""


def _select(data: dict[str, bytes], items: list[dict[str, Any]] | None, mode: int) -> Files:
    if not items:
        return {k: (v, mode) for k, v in data.items()}
    return {
        it["path"]: (data[it["key"]], int(it.get("mode", mode)))
        for it in items
        if it["key"] in data
    }


@dataclass
class VolumeSource:
    """Reads what volumes refer to, as the pod's node (the Node authorizer decides)."""

    api: AsyncApi

    async def _get(self, path: str) -> dict[str, Any] | None:
        # Right after a pod is bound the Node authorizer may not know of it yet: retry 403s.
        for _ in range(50):
            try:
                return await self.api.get(path)
            except ApiStatus as exc:
                if exc.status != 403:
                    raise
                await asyncio.sleep(0.1)
        raise VolumeNotReady(f"{path}: still forbidden")

    async def secret(self, ns: str, name: str) -> dict[str, bytes] | None:
        obj = await self._get(f"/api/v1/namespaces/{ns}/secrets/{name}")
        if obj is None:
            return None
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    async def configmap(self, ns: str, name: str) -> dict[str, bytes] | None:
        obj = await self._get(f"/api/v1/namespaces/{ns}/configmaps/{name}")
        if obj is None:
            return None
        return {k: v.encode() for k, v in (obj.get("data") or {}).items()}

    async def token(self, pod: dict[str, Any], src: dict[str, Any]) -> bytes:
        meta = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": int(src.get("expirationSeconds", 3607)),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if src.get("audience"):
            spec["audiences"] = [src["audience"]]
        for _ in range(50):
            try:
                got = await self.api.request(
                    "POST",
                    f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
                    {
                        "apiVersion": "authentication.k8s.io/v1",
                        "kind": "TokenRequest",
                        "spec": spec,
                    },
                )
                return str(got["status"]["token"]).encode()
            except ApiStatus as exc:
                if exc.status not in (403, 404):
                    raise
                await asyncio.sleep(0.1)
        raise VolumeNotReady(f"no token for service account {sa}")

    async def files(self, pod: dict[str, Any], vol: dict[str, Any]) -> Files:
        ns = pod["metadata"]["namespace"]
        for kind, name_key, read in (
            ("secret", "secretName", self.secret),
            ("configMap", "name", self.configmap),
        ):
            if kind in vol:
                src = vol[kind]
                data = await read(ns, src[name_key])
                if data is None:
                    if src.get("optional"):
                        return {}
                    raise VolumeNotReady(f"{kind} {src[name_key]} not found")
                return _select(data, src.get("items"), int(src.get("defaultMode", 0o644)))
        if "projected" in vol:
            return await self._projected(pod, vol["projected"])
        return {}  # emptyDir and the rest: an empty directory

    async def _projected(self, pod: dict[str, Any], proj: dict[str, Any]) -> Files:
        mode = int(proj.get("defaultMode", 0o644))
        out: Files = {}
        for src in proj.get("sources") or []:
            if "serviceAccountToken" in src:
                tok = src["serviceAccountToken"]
                out[tok["path"]] = (await self.token(pod, tok), mode)
            elif "configMap" in src or "secret" in src:
                kind = "configMap" if "configMap" in src else "secret"
                sub = {kind: {**src[kind], "defaultMode": mode}}
                if kind == "secret":
                    sub["secret"]["secretName"] = src["secret"]["name"]
                out.update(await self.files(pod, sub))
            elif "downwardAPI" in src:
                for it in src["downwardAPI"].get("items") or []:
                    field = (it.get("fieldRef") or {}).get("fieldPath", "")
                    value = _field(pod, field)
                    out[it["path"]] = (value.encode(), int(it.get("mode", mode)))
        return out


def _field(pod: dict[str, Any], path: str) -> str:
    meta = pod["metadata"]
    return str(
        {
            "metadata.namespace": meta["namespace"],
            "metadata.name": meta["name"],
            "metadata.uid": meta["uid"],
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "spec.nodeName": pod["spec"].get("nodeName", ""),
        }.get(path, "")
    )


def write(dir: Path, files: Files, dir_mode: int) -> None:
    """Write the files (modes as given), the directory itself with `dir_mode`."""
    dir.mkdir(parents=True, exist_ok=True)
    dir.chmod(dir_mode)
    for path, (content, mode) in files.items():
        target = dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
