"""A small asyncio client of the Kubernetes API for the local kubelets (aiohttp)."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

STRATEGIC = "application/strategic-merge-patch+json"


class ApiStatus(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status


@dataclass
class AsyncApi:
    """Talks to the API server as the user of one kubeconfig."""

    kubeconfig: Path
    server: str = ""
    _ssl: ssl.SSLContext = field(default_factory=ssl.create_default_context)
    _headers: dict[str, str] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = cluster["server"]
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        if "client-certificate" in user:
            ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        if "token" in user:
            self._headers["Authorization"] = f"Bearer {user['token']}"
        self._ssl = ctx

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=64),
                read_bufsize=1 << 22,
                headers=self._headers,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with self.session.request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=60),
        ) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise ApiStatus(resp.status, text)
            return json.loads(text) if text else None

    async def get(self, path: str) -> Any | None:
        try:
            return await self.request("GET", path)
        except ApiStatus as exc:
            if exc.status == 404:
                return None
            raise

    async def watch(
        self, path: str, params: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """List, then watch from there; resumes after timeouts and relists after a 410."""
        params = dict(params or {})
        version = ""
        while True:
            if not version:
                listing = await self.request("GET", path, params=params)
                version = listing["metadata"]["resourceVersion"]
                for item in listing.get("items") or []:
                    yield "ADDED", item
            q = {
                **params,
                "watch": "1",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "240",
            }
            try:
                async with self.session.get(
                    self.server + path, params=q, timeout=aiohttp.ClientTimeout(total=None)
                ) as resp:
                    if resp.status >= 300:
                        version = "" if resp.status == 410 else version
                        await asyncio.sleep(0.2)
                        continue
                    async for line in resp.content:
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            version = "" if obj.get("code") == 410 else version
                            break
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            yield event["type"], obj
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.5)
