"""A thin HTTPS proxy in front of the real apiserver that injects faults into the operator's
requests: a refusal of the next matching write (409, 500, ...), matching writes held until the
test lets them through (an apiserver slow to answer), or a cut of every open watch.
The operator authenticates with a bearer token, which passes through unchanged."""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from localcluster import procs
from localcluster.controlplane import ControlPlane

HOP = {"host", "connection", "upgrade", "transfer-encoding", "content-length", "keep-alive"}


@dataclass
class Fault:
    verb: str  # "patch", "create", ...
    resource: str  # "scaleouts/status", "pods", ...
    status: int  # 0: no answer at all, the connection is closed (a restart, a load balancer)
    times: int = 1  # how many matching requests it refuses

    def matches(self, method: str, path: str) -> bool:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method, "get"
        )
        plural, _, sub = self.resource.partition("/")
        tail = rf"/{plural}/[^/]+/{sub}$" if sub else rf"/{plural}(/[^/]+)?$"
        return verb == self.verb and re.search(tail, path) is not None


WRITES = {"POST", "PUT", "PATCH", "DELETE"}


@dataclass
class Crash:
    """Kill the operator right after a write of it has landed (before it hears the answer)."""

    kill: Callable[[], None]
    after: int | None = None  # the n-th write from now (events are not counted)
    when: Callable[[str, str, bytes], bool] | None = None  # or the first write this matches
    writes: int = 0
    fired: bool = False
    killed: threading.Event = field(default_factory=threading.Event)

    def hit(self, method: str, path: str, body: bytes) -> bool:
        if self.fired or method not in WRITES or path.endswith("/events"):
            return False
        self.writes += 1
        self.fired = self.writes == self.after or bool(self.when and self.when(method, path, body))
        return self.fired


@dataclass
class FaultProxy:
    cp: ControlPlane
    port: int = field(default_factory=procs.free_port)
    faults: list[Fault] = field(default_factory=list)
    _watches: set[web.StreamResponse] = field(default_factory=set)
    _loop: asyncio.AbstractEventLoop | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _crash: Crash | None = None
    _gates: list[tuple[Fault, threading.Event]] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # plurals whose watch events are held back
    # Plurals whose next watch event is cut in half, the answer then ended cleanly: a proxy
    # that ends its own answer when the apiserver broke its. Each cut once.
    cut: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, name="faultproxy", daemon=True).start()
        ready.wait(30)
        return self

    def inject(self, verb: str, resource: str, status: int = 409, times: int = 1) -> None:
        with self._lock:
            self.faults.append(Fault(verb, resource, status, times))

    def gate(self, verb: str, resource: str) -> threading.Event:
        """Matching requests wait (the apiserver has not seen them) until the event is set."""
        opened = threading.Event()
        with self._lock:
            self._gates.append((Fault(verb, resource, 0), opened))
        return opened

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            for _, opened in self._gates:
                opened.set()
            self._gates.clear()

    def arm_crash(self, crash: Crash) -> Crash:
        with self._lock:
            self._crash = crash
        return crash

    def disarm(self) -> Crash | None:
        with self._lock:
            crash, self._crash = self._crash, None
        return crash

    def pending(self) -> list[Fault]:
        with self._lock:
            return list(self.faults)

    def drop_watches(self) -> None:
        """Cut every watch stream the operator has open (as a load balancer might)."""
        assert self._loop is not None

        async def _drop() -> None:
            for resp in list(self._watches):
                if resp.task is not None:
                    resp.task.cancel()

        asyncio.run_coroutine_threadsafe(_drop(), self._loop).result(10)

    async def _serve(self) -> None:
        pair = self.cp.serving_cert("faultproxy", ("127.0.0.1",))
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        self._upstream = aiohttp.ClientSession(
            # No pool limit: a killed operator's watches stay open upstream until they time out,
            # and after enough kills a limited pool would make every new request wait.
            connector=aiohttp.TCPConnector(
                ssl=ssl.create_default_context(cafile=str(self.cp.ca)), limit=0
            ),
            read_bufsize=1 << 22,
            # Bytes pass through as the apiserver sent them: decompressing here and forwarding
            # its Content-Encoding: gzip broke every LIST large enough to be compressed.
            auto_decompress=False,
        )
        app = web.Application(client_max_size=1 << 26)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A request whose client went away is cancelled, releasing its upstream request.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=ctx).start()

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.matches(method, path):
                    f.times -= 1
                    if f.times <= 0:
                        self.faults.remove(f)
                    return f
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        fault = self._take(request.method, request.path)
        if fault is not None and fault.status == 0:
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("dropped by the test's fault proxy")
        if fault is not None:
            return web.json_response(_status(fault.status), status=fault.status)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        with self._lock:
            gates = [g for f, g in self._gates if f.matches(request.method, request.path)]
        while gates and not gates[0].is_set():
            await asyncio.sleep(0.02)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read()
        # Decided as the write arrives, so `fired` is set before the write can be seen landed.
        with self._lock:
            crash = (
                self._crash
                if self._crash and self._crash.hit(request.method, request.path, body)
                else None
            )
        async with self._upstream.request(
            request.method,
            self.cp.url + request.path_qs,
            headers=headers,
            data=body or None,
            skip_auto_headers=("Content-Type",),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as up:
            if crash is not None:
                crash.kill()  # the write has landed; its answer never reaches the operator
                crash.killed.set()
                return web.Response(status=503)
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in HOP:
                    resp.headers[k] = v
            try:
                await resp.prepare(request)
            except ConnectionResetError:  # the operator went away (killed) before its answer
                return resp
            watching = request.query.get("watch") in ("1", "true")
            if watching:
                self._watches.add(resp)
            plural = request.path.rstrip("/").rsplit("/", 1)[-1]
            try:
                async for chunk in up.content.iter_any():
                    while watching and plural in self.held:  # a cache falling behind
                        await asyncio.sleep(0.05)
                    if watching and plural in self.cut and b"\n" in chunk:
                        self.cut.discard(plural)
                        await resp.write(chunk[: chunk.index(b"\n") // 2])
                        break
                    await resp.write(chunk)
                await resp.write_eof()
            except aiohttp.ClientPayloadError:
                # The apiserver went away mid-answer: so does the operator's connection, as it
                # would without a proxy between. Ended cleanly, the answer's last line would
                # read as whole (kopf parses it, fails, and the operator stops).
                if request.transport is not None:
                    request.transport.abort()
            except ConnectionResetError:
                pass  # the operator went away mid-stream
            finally:
                self._watches.discard(resp)
            return resp

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        headers = {"Authorization": request.headers.get("Authorization", "")}
        async with self._upstream.ws_connect(
            self.cp.url.replace("https", "wss") + request.path_qs,
            protocols=[p for p in wanted if p],
            headers=headers,
        ) as up:
            down = web.WebSocketResponse(protocols=[up.protocol] if up.protocol else [])
            await down.prepare(request)
            async for msg in up:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    await down.send_bytes(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    await down.send_str(msg.data)
            await down.close()
            return down


def _status(code: int) -> dict[str, Any]:
    reason = {
        403: "Forbidden",
        409: "Conflict",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
    }.get(code, "Unknown")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"injected by the test's fault proxy: {reason}",
        "reason": reason,
        "code": code,
    }
