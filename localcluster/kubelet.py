"""The simulated kubelet of the integration tier: a real API client without a container runtime
(the full chain, the demo and the benchmarks of real training run on real nodes, node.py).

A `Kubelet` registers its Node objects, binds pending pods to them through `pods/binding` (as
the scheduler's identity), watches its pods with a server-side field selector and reports
through `pods/status` (as `system:node:<node>`, so the Node authorizer and NodeRestriction
apply), finishes graceful deletions, and serves the kubelet API the apiserver calls over TLS:
`/containerLogs` (kubectl logs) and `/exec` over WebSocket (pods/exec).

Workers get a real sshd trusting the job's mounted key; other containers run nothing. What
tests do to pods (end them, hold them Pending, make sshd refuse the key) is `TestControls`.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from etoperator.builders.ssh import generate_keypair
from localcluster import procs, volumes
from localcluster.apiclient import STRATEGIC, ApiStatus, AsyncApi
from localcluster.controlplane import ControlPlane

SSHD = "/usr/sbin/sshd"
NODE = "node-1"
Key = tuple[str, str]
T = TypeVar("T")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_key(workdir: Path) -> Path:
    key = workdir / "ssh_host_ed25519_key"
    if not key.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


async def wait_port(ip: str, port: int, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            _, writer = await asyncio.open_connection(ip, port)
            writer.close()
            return True
        except OSError:
            await asyncio.sleep(0.02)
    return False


def sshd_config(ip: str, port: int, hostkey: Path, authorized: Path) -> str:
    """The simulated workers' sshd. Its key file lives in a scratch directory whose parents
    StrictModes would refuse (real nodes run the training image's own sshd and config)."""
    return "\n".join(
        [
            f"ListenAddress {ip}:{port}",
            f"HostKey {hostkey}",
            f"AuthorizedKeysFile {authorized}",
            "PidFile none",
            "StrictModes no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PermitUserEnvironment no",
            "LogLevel ERROR",
            "",
        ]
    )


def exit_status(code: int) -> dict[str, Any]:
    """The exec error channel's last message: a metav1.Status, as the kubelet sends it."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class TestControls:
    """What tests do to pods (call from another thread): end them, hold and release them, make
    their sshd refuse and then take the job's key, notice them for preemption."""

    if TYPE_CHECKING:  # provided by Kubelet
        workdir: Path
        held: set[Key]
        refusing: set[Key]
        pods: dict[Key, dict[str, Any]]
        ips: dict[Key, str]

        def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T: ...
        def _kill(self, key: Key) -> None: ...
        def _on(self, node: str, pod: dict[str, Any], etype: str) -> None: ...
        async def mark_terminated(self, key: Key, exit_code: int, reason: str = "") -> None: ...
        async def _patch_status(self, node: str, key: Key, status: dict[str, Any]) -> None: ...

    def finish(self, namespace: str, name: str, exit_code: int = 0, reason: str = "") -> None:
        """End the pod's container: Succeeded for 0, Failed otherwise."""
        key = (namespace, name)
        self._kill(key)
        self.call(self.mark_terminated(key, exit_code, reason))

    def accept_key(self, namespace: str, name: str) -> None:
        """A worker started with `refusing` now trusts the job's key."""
        key = (namespace, name)
        self.refusing.discard(key)
        ssh_dir = self.workdir / namespace / name / "ssh"
        (ssh_dir / "authorized_keys.job").replace(ssh_dir / "authorized_keys")

    def release(self, namespace: str, name: str) -> None:
        """Let a pod held Pending (see `held`) start now."""
        key = (namespace, name)
        self.held.discard(key)

        async def _do() -> None:
            pod = self.pods.get(key)
            if pod is not None:
                self._on(pod["spec"]["nodeName"], pod, "MODIFIED")

        self.call(_do())

    def disrupt(self, namespace: str, name: str) -> None:
        """A DisruptionTarget condition, as the control plane sets before a preemption."""
        key = (namespace, name)
        cond = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "preempted to make room for a pod of higher priority",
            "lastTransitionTime": now_iso(),
        }
        pod = self.pods[key]
        self.call(self._patch_status(pod["spec"]["nodeName"], key, {"conditions": [cond]}))

    def ip(self, namespace: str, name: str) -> str | None:
        return self.ips.get((namespace, name))


@dataclass
class Kubelet(TestControls):
    cp: ControlPlane
    workdir: Path
    ssh_port: int = 2222
    run_sshd: bool = True  # off: workers run nothing (benchmarks of thousands of pods)
    held: set[Key] = field(default_factory=set)  # tests keep these Pending
    refusing: set[Key] = field(default_factory=set)  # Running, but sshd refuses the job's key
    lingering: set[Key] = field(default_factory=set)  # deletion left unfinished
    nodes: dict[Key, str] = field(default_factory=dict)  # pod -> node (else NODE)
    started_at: dict[Key, float] = field(default_factory=dict)  # monotonic, when Running
    ips: dict[Key, str] = field(default_factory=dict)
    procs: dict[Key, subprocess.Popen[bytes]] = field(default_factory=dict)
    pods: dict[Key, dict[str, Any]] = field(default_factory=dict)  # last seen, bound here
    ip_prefix: str = "127.10"
    _seq: int = 0
    _started: set[str] = field(default_factory=set)  # pod uids: each is started once
    _deleting: set[str] = field(default_factory=set)
    _clients: dict[str, AsyncApi] = field(default_factory=dict)
    _registered: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _tasks: set[asyncio.Future[Any]] = field(default_factory=set)
    _thread: threading.Thread | None = None
    _api: KubeletAPI | None = None
    port: int = 0  # the kubelet API's TLS port

    # -- running in a thread of its own --------------------------------------------------

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = procs.free_port()
        self._scheduler = AsyncApi(self.cp.user_kubeconfig("scheduler", "system:kube-scheduler"))
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._api = KubeletAPI(self)
            loop.run_until_complete(self._api.serve())
            ready.set()
            self.spawn(self._bind_loop())
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="kubelet", daemon=True)
        self._thread.start()
        ready.wait(30)
        self.call(self.register(NODE))

    def spawn(self, aw: Coroutine[Any, Any, T] | asyncio.Future[T]) -> asyncio.Future[T]:
        """Run in the background on the kubelet's loop, keeping a reference until it ends."""
        fut = asyncio.ensure_future(aw, loop=self._loop)
        self._tasks.add(fut)
        fut.add_done_callback(self._tasks.discard)
        return fut

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run a coroutine on the kubelet's loop from another thread and wait for it."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        for key in list(self.procs):
            self._kill(key)
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self.call(self._close(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._api is not None:
            await self._api.close()
        for c in [*self._clients.values(), self._scheduler]:
            await c.close()

    # -- nodes, binding, the pod watch --------------------------------------------------

    def client(self, node: str) -> AsyncApi:
        if node not in self._clients:
            kc = self.cp.user_kubeconfig(f"node-{node}", f"system:node:{node}", ("system:nodes",))
            self._clients[node] = AsyncApi(kc)
        return self._clients[node]

    async def register(self, node: str) -> None:
        """The Node object and its status, then a watch of the pods bound to it."""
        if node not in self._registered:
            await register_node(self.client(node), node, self.port)
            self._registered[node] = self.spawn(self._pod_loop(node))

    async def _watch_pods(
        self, api: AsyncApi, selector: str, on: Callable[[str, dict[str, Any]], None]
    ) -> None:
        """Pods matching a field selector, for ever (a refused watch is retried)."""
        while True:
            try:
                async for etype, pod in api.watch("/api/v1/pods", {"fieldSelector": selector}):
                    on(etype, pod)
            except ApiStatus as exc:
                print(f"kubelet: pod watch {selector} failed: {exc}", flush=True)
                await asyncio.sleep(1)

    async def _bind_loop(self) -> None:
        def on(etype: str, pod: dict[str, Any]) -> None:
            if etype != "DELETED" and not pod["spec"].get("nodeName"):
                self.spawn(self._bind(pod))

        await self._watch_pods(self._scheduler, "spec.nodeName=", on)

    async def _bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        node = self.nodes.get((meta["namespace"], meta["name"]), NODE)
        await self.register(node)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self._scheduler.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                binding,
            )
        except ApiStatus as exc:
            if exc.status not in (404, 409):
                raise

    async def _pod_loop(self, node: str) -> None:
        await self._watch_pods(
            self.client(node), f"spec.nodeName={node}", lambda t, pod: self._on(node, pod, t)
        )

    def _on(self, node: str, pod: dict[str, Any], etype: str) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        loop = asyncio.get_running_loop()
        if etype == "DELETED":
            self.pods.pop(key, None)
            if key not in self.lingering:
                self.spawn(loop.run_in_executor(None, self._kill, key))
            return
        self.pods[key] = pod
        if meta.get("deletionTimestamp"):
            if meta["uid"] not in self._deleting and key not in self.lingering:
                self._deleting.add(meta["uid"])
                self.spawn(self._delete_pod(node, key, meta["uid"]))
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Pending" and meta["uid"] not in self._started and key not in self.held:
            self._started.add(meta["uid"])
            self.spawn(self._start(node, key, pod))

    async def _start(self, node: str, key: Key, pod: dict[str, Any]) -> None:
        try:
            ip = self.ips.setdefault(key, self.next_ip())
            running = await self.run_pod(node, key, pod, ip)
        except volumes.VolumeNotReady as exc:
            print(f"kubelet: {key[1]} stays Pending: {exc}", flush=True)
            self._started.discard(pod["metadata"]["uid"])
            return
        if running and self.current(key, pod["metadata"]["uid"]) is not None:
            await self._mark_running(node, key, pod, ip)
        elif not running:
            self._kill(key)

    async def _delete_pod(self, node: str, key: Key, uid: str) -> None:
        """Graceful deletion: stop the pod's processes, then remove the pod for good."""
        await asyncio.get_running_loop().run_in_executor(None, self._kill, key)
        try:
            await self.client(node).request(
                "DELETE",
                f"/api/v1/namespaces/{key[0]}/pods/{key[1]}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
        except ApiStatus as exc:
            if exc.status not in (404, 409):
                raise

    def current(self, key: Key, uid: str) -> dict[str, Any] | None:
        pod = self.pods.get(key)
        if pod is None or pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
            return None
        return pod

    def next_ip(self) -> str:
        n = self._seq
        self._seq += 1
        return f"{self.ip_prefix}.{n // 250}.{n % 250 + 2}"

    # -- what a pod runs ----------------------------------------------------------------------

    async def run_pod(self, node: str, key: Key, pod: dict[str, Any], ip: str) -> bool:
        """Start the pod; True once it runs. Here: workers get a real sshd, others nothing."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get("training-job-role") != "worker" or not self.run_sshd:
            return True
        return await self._sshd(node, key, pod, ip)

    async def _sshd(self, node: str, key: Key, pod: dict[str, Any], ip: str) -> bool:
        """A worker's sshd on its own IP, trusting the keys of its Secret volume."""
        d = self.workdir / key[0] / key[1]
        for vol in pod["spec"].get("volumes") or []:
            if "secret" in vol:
                files = await volumes.VolumeSource(self.client(node)).files(pod, vol)
                volumes.write(d / "ssh", files, 0o700)
                break
        cfg = sshd_files(d, ip, self.ssh_port, self.workdir, refusing=key in self.refusing)
        if cfg is None:
            return False
        self.procs[key] = procs.spawn([SSHD, "-D", "-e", "-f", str(cfg)], d / "sshd.log")
        return await wait_port(ip, self.ssh_port)

    def _kill(self, key: Key) -> None:
        proc = self.procs.pop(key, None)
        procs.stop(proc, grace=2)

    async def exec(self, key: Key, argv: list[str]) -> tuple[int, bytes, bytes]:
        """pods/exec: simulated containers share this machine, so the command runs here."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.exec_env(key),
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out, err

    def exec_env(self, key: Key) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": key[1]}

    def log_path(self, key: Key) -> Path | None:
        return None

    # -- pods/status ------------------------------------------------------------------------

    async def _patch_status(self, node: str, key: Key, status: dict[str, Any]) -> None:
        try:
            await self.client(node).request(
                "PATCH",
                f"/api/v1/namespaces/{key[0]}/pods/{key[1]}/status",
                {"status": status},
                None,
                STRATEGIC,
            )
        except ApiStatus as exc:
            if exc.status not in (404, 409):
                raise

    async def _mark_running(self, node: str, key: Key, pod: dict[str, Any], ip: str) -> None:
        await self._patch_status(node, key, running_status(pod, ip, now_iso()))
        self.started_at[key] = time.monotonic()

    async def mark_terminated(self, key: Key, exit_code: int, reason: str = "") -> None:
        pod = self.pods.get(key)
        if pod is not None:
            status = terminated_status(pod, exit_code, reason, now_iso())
            await self._patch_status(pod["spec"]["nodeName"], key, status)


def running_status(pod: dict[str, Any], ip: str, ts: str) -> dict[str, Any]:
    """The pod status a kubelet reports once the containers run."""
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "startTime": ts,
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": ts}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True,
                "started": True, "restartCount": 0, "state": {"running": {"startedAt": ts}},
            }
            for c in pod["spec"]["containers"]
        ],
    }  # fmt: skip


def terminated_status(pod: dict[str, Any], code: int, reason: str, ts: str) -> dict[str, Any]:
    """The pod status a kubelet reports once the containers ended (exit code `code`)."""
    why = reason or ("Completed" if code == 0 else "Error")
    ended = {"exitCode": code, "finishedAt": ts, "reason": why}
    status: dict[str, Any] = {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": [
            {"type": t, "status": "False", "lastTransitionTime": ts}
            for t in ("ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                "started": False, "restartCount": 0, "state": {"terminated": ended},
            }
            for c in pod["spec"]["containers"]
        ],
    }  # fmt: skip
    if reason:
        status["reason"] = reason
    return status


def node_status(node: str, port: int) -> dict[str, Any]:
    room = {"cpu": "64", "memory": "256Gi", "pods": "100000"}
    return {
        "capacity": room,
        "allocatable": room,
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": node},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "local kubelet is posting ready status",
                "lastHeartbeatTime": now_iso(),
                "lastTransitionTime": now_iso(),
            }
        ],
    }


class KubeletAPI:
    """The kubelet API the apiserver calls over TLS: /containerLogs and /exec (WebSocket)."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.k = kubelet
        self._runner: web.AppRunner | None = None

    async def serve(self) -> None:
        pair = self.k.cp.serving_cert("kubelet", ("127.0.0.1", "localhost"))
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.k.cp.ca))
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        ctx.verify_mode = ssl.CERT_REQUIRED  # only the apiserver's kubelet client certificate
        app = web.Application()
        app.router.add_get("/containerLogs/{ns}/{pod}/{container}", self._logs)
        app.router.add_route("*", "/exec/{ns}/{pod}/{container}", self._exec)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.k.port, ssl_context=ctx).start()

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["ns"], request.match_info["pod"])
        path = self.k.log_path(key)
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        follow = request.query.get("follow") in ("true", "1")
        offset = 0
        while True:
            data = path.read_bytes()[offset:] if path is not None and path.exists() else b""
            if data:
                await resp.write(data)
                offset += len(data)
            if not follow or (key not in self.k.procs and key in self.k.pods):
                break
            await asyncio.sleep(0.2)
        return resp

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        """pods/exec over WebSocket (channel 1 stdout, 2 stderr, 3 the closing Status)."""
        key = (request.match_info["ns"], request.match_info["pod"])
        argv = request.query.getall("command", [])
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io", "channel.k8s.io"))
        await ws.prepare(request)
        if key not in self.k.pods:
            code, out, err = 126, b"", b"the container is not running\n"
        else:
            code, out, err = await self.k.exec(key, argv)
        for channel, data in ((1, out), (2, err)):
            if data:
                await ws.send_bytes(bytes([channel]) + data)
        await ws.send_bytes(b"\x03" + json.dumps(exit_status(code)).encode())
        await ws.close()
        return ws

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def register_node(api: AsyncApi, node: str, port: int) -> None:
    """A Node object of that name (made once) and a Ready status naming the kubelet's port."""
    labels = {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}
    try:
        await api.request(
            "POST",
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}},
        )
    except ApiStatus as exc:
        if exc.status != 409:
            raise
    status = {"status": node_status(node, port)}
    await api.request("PATCH", f"/api/v1/nodes/{node}/status", status, None, STRATEGIC)


def sshd_files(d: Path, ip: str, port: int, workdir: Path, refusing: bool) -> Path | None:
    """The sshd_config of a pod's sshd (None: no authorized_keys to trust yet). `refusing`:
    it trusts some other key, so the job's is refused (test_lifecycle's readiness gate)."""
    authorized = d / "ssh" / "authorized_keys"
    if not authorized.exists():
        return None
    if refusing:
        authorized.rename(d / "ssh" / "authorized_keys.job")
        authorized.write_text(generate_keypair("stranger").public_openssh)
    cfg = d / "sshd_config"
    cfg.write_text(sshd_config(ip, port, host_key(workdir), authorized))
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    return cfg
