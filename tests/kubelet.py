"""A simulated kubelet for the emulator: binds pods to a node, moves them through
Pending -> Running -> Succeeded/Failed, and finishes graceful deletions.

Workers get a real OpenSSH sshd on a loopback address of their own (their podIP), trusting the
public key from the job's Secret as mounted in the pod, so the operator's paramiko readiness
and drain checks talk to a real SSH server. Other containers run no process; tests end them
with `finish()`.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.emulator import ops
from tests.emulator.server import Emulator, Watcher, now_iso

SSHD = "/usr/sbin/sshd"
NODE = "node-1"


def host_key(workdir: Path) -> Path:
    key = workdir / "ssh_host_ed25519_key"
    if not key.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def sshd_config(ip: str, port: int, hostkey: Path, authorized: Path) -> str:
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


@dataclass
class SimKubelet:
    emulator: Emulator
    workdir: Path
    ssh_port: int = 2222
    run_sshd: bool = True
    procs: dict[tuple[str, str], subprocess.Popen[bytes]] = field(default_factory=dict)
    ips: dict[tuple[str, str], str] = field(default_factory=dict)
    held: set[tuple[str, str]] = field(default_factory=set)  # tests keep these Pending
    lingering: set[tuple[str, str]] = field(default_factory=set)  # deletion left unfinished
    nodes: dict[tuple[str, str], str] = field(default_factory=dict)  # pod -> node (else NODE)
    started_at: dict[tuple[str, str], float] = field(default_factory=dict)  # monotonic, Running
    _ip_seq: itertools.count[int] = field(default_factory=lambda: itertools.count(0))
    _task: asyncio.Task[None] | None = None
    _started: set[str] = field(default_factory=set)  # pod uids: each is started once
    _deleting: set[str] = field(default_factory=set)

    @property
    def store(self) -> Any:
        return self.emulator.store

    async def exec(self, namespace: str, name: str, argv: list[str]) -> tuple[int, bytes, bytes]:
        """pods/exec: the simulated containers share this machine, so the command runs here."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.exec_env(namespace, name),
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out, err

    def exec_env(self, namespace: str, name: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": name}

    def start(self) -> None:
        self.emulator.exec_handler = self.exec
        if self.run_sshd:
            host_key(self.workdir)
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)

        async def _start() -> None:
            self._task = asyncio.create_task(self._run())

        self.emulator.call(lambda: asyncio.ensure_future(_start()))

    def stop(self) -> None:
        for proc in list(self.procs.values()):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def next_ip(self) -> str:
        n = next(self._ip_seq)
        return f"127.10.{n // 250}.{n % 250 + 2}"

    async def _run(self) -> None:
        res = self.store.resources[("", "pods")]
        watcher = Watcher(
            res, None, ops.label_matcher(None), ops.field_matcher(None), asyncio.Queue()
        )
        self.store.watchers.append(watcher)
        for pod in list(self.store.list(res, None, watcher.labels, watcher.fields)):
            self._on(pod, "ADDED")
        while True:
            item = await watcher.queue.get()
            if item is None:
                return
            _, etype, pod = item
            self._on(pod, etype)

    def _on(self, pod: dict[str, Any], etype: str) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if etype == "DELETED":
            self._kill(key)
            return
        if meta.get("deletionTimestamp"):
            if meta["uid"] not in self._deleting and key not in self.lingering:
                self._deleting.add(meta["uid"])
                asyncio.create_task(self._delete_pod(key, meta["uid"]))
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Pending" and meta["uid"] not in self._started and key not in self.held:
            self._started.add(meta["uid"])
            asyncio.create_task(self._start_pod(key, meta["uid"]))

    async def _delete_pod(self, key: tuple[str, str], uid: str) -> None:
        """Graceful deletion: stop the pod's processes, then remove the pod for good."""
        await asyncio.to_thread(self._kill, key)
        self._finalize(key, uid)

    def _finalize(self, key: tuple[str, str], uid: str) -> None:
        res = self.store.resources[("", "pods")]
        obj = self.store.objects[res.key].get(key)
        if obj is not None and obj["metadata"]["uid"] == uid:
            self.store._remove(res, key)

    def _kill(self, key: tuple[str, str]) -> None:
        proc = self.procs.pop(key, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _current(self, key: tuple[str, str], uid: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.store.objects[("", "pods")].get(key)
        if obj is None or obj["metadata"]["uid"] != uid or obj["metadata"].get("deletionTimestamp"):
            return None
        return obj

    async def _start_pod(self, key: tuple[str, str], uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None:
            return
        ip = self.ips.setdefault(key, self.next_ip())
        labels = pod["metadata"].get("labels") or {}
        if self.run_sshd and labels.get("training-job-role") == "worker":
            if not await self._sshd(key, pod, ip):
                return
        pod = self._current(key, uid)
        if pod is None:
            self._kill(key)
            return
        self._mark_running(key, ip, [c["name"] for c in pod["spec"]["containers"]])

    async def _sshd(self, key: tuple[str, str], pod: dict[str, Any], ip: str) -> bool:
        pubkey = self._mounted_pubkey(pod)
        if pubkey is None:
            return False
        d = self.workdir / key[0] / key[1]
        d.mkdir(parents=True, exist_ok=True)
        (d / "authorized_keys").write_text(pubkey)
        cfg = d / "sshd_config"
        cfg.write_text(
            sshd_config(ip, self.ssh_port, host_key(self.workdir), d / "authorized_keys")
        )
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(d / "sshd.log", "ab"),
            start_new_session=True,
        )
        self.procs[key] = proc
        return await wait_port(ip, self.ssh_port)

    def _mounted_pubkey(self, pod: dict[str, Any]) -> str | None:
        for vol in pod["spec"].get("volumes") or []:
            secret = vol.get("secret")
            if not secret:
                continue
            obj = self.store.objects[("", "secrets")].get(
                (pod["metadata"]["namespace"], secret["secretName"])
            )
            if obj is None:
                return None
            data = {
                **{k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()},
                **(obj.get("stringData") or {}),
            }
            return data.get("id_rsa.pub")
        return None

    def _mark_running(self, key: tuple[str, str], ip: str, containers: list[str]) -> None:
        self._set_status(
            key,
            {
                "phase": "Running",
                "podIP": ip,
                "hostIP": "127.0.0.1",
                "startTime": now_iso(),
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": now_iso()}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": [
                    {
                        "name": n,
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now_iso()}},
                    }
                    for n in containers
                ],
            },
            node=self.nodes.get(key, NODE),
        )
        self.started_at[key] = time.monotonic()

    def _mark_terminated(self, key: tuple[str, str], exit_code: int, reason: str = "") -> None:
        code_reason = "Completed" if exit_code == 0 else "Error"
        self._set_status(
            key,
            {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "reason": reason or None,
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "finishedAt": now_iso(),
                                "reason": code_reason,
                            }
                        },
                    }
                ],
            },
        )

    def _set_status(
        self, key: tuple[str, str], status: dict[str, Any], node: str | None = None
    ) -> None:
        res = self.store.resources[("", "pods")]
        obj = copy.deepcopy(self.store.objects[res.key][key])
        if node:
            obj["spec"]["nodeName"] = node
        obj["status"] = {**(obj.get("status") or {}), **status}
        obj["metadata"].pop("resourceVersion", None)
        self.store.replace(res, key[0], key[1], obj)
        new = copy.deepcopy(self.store.objects[res.key][key])
        new["status"] = obj["status"]
        new["metadata"].pop("resourceVersion", None)
        self.store.replace(res, key[0], key[1], new, "status")

    # -- test controls (call from the test thread) -----------------------------------------

    def finish(self, namespace: str, name: str, exit_code: int = 0, reason: str = "") -> None:
        """End the pod's container: Succeeded for 0, Failed otherwise."""

        def _do() -> None:
            key = (namespace, name)
            self._kill(key)
            self._mark_terminated(key, exit_code, reason)

        self.emulator.call(_do)

    def release(self, namespace: str, name: str) -> None:
        """Let a pod held Pending (see `held`) start now."""
        self.held.discard((namespace, name))
        pods = self.store.objects[("", "pods")]
        self.emulator.call(lambda: self._on(pods[(namespace, name)], "MODIFIED"))

    def disrupt(self, namespace: str, name: str) -> None:
        """A DisruptionTarget condition, as the control plane sets before a preemption."""

        def _do() -> None:
            key = (namespace, name)
            obj = self.store.objects[("", "pods")][key]
            conds = list((obj.get("status") or {}).get("conditions") or [])
            conds.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "lastTransitionTime": now_iso(),
                }
            )
            self._set_status(key, {"conditions": conds})

        self.emulator.call(_do)

    def kill_process(self, namespace: str, name: str) -> None:
        """Kill the worker's sshd only (the pod stays Running until someone notices)."""
        proc = self.procs.get((namespace, name))
        if proc is not None:
            os.killpg(proc.pid, signal.SIGKILL)

    def ip(self, namespace: str, name: str) -> str | None:
        return self.ips.get((namespace, name))
