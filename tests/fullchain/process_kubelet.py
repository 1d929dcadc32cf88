"""A process kubelet: runs each pod's first container as real local processes.

What it maps, per pod:
  - processes: the container command (+ args) runs under `unshare --mount --pid`, so the pod
    has its own process table (`/proc`) and all of its processes die with it, as in a container;
  - network: the pod's IP is a loopback address of its own (127.20.x.y). A container whose
    command is sshd gets `-o ListenAddress=<podIP>:<port> -o PidFile=none` added, since every pod
    shares the machine's network stack;
  - name resolution: "cluster DNS" for ssh: every pod's /root/.ssh/config starts with one
    `Host <pod> / HostName <podIP> / Port <port>` block per pod of its namespace (the port is
    2022 by default, so that an sshd of the machine's own on *:22 does not get in the way),
    kept current as pods come
    and go (Horovod reaches hosts over ssh; its own traffic uses the `lo` interface);
  - volumes: Secret and ConfigMap volumes (items, modes) are written to per-pod directories
    and bind-mounted at their mountPath; the service-account token, CA and namespace at
    /var/run/secrets/kubernetes.io/serviceaccount; KUBERNETES_SERVICE_HOST/PORT point at the
    API emulator;
  - the image: the repository is bind-mounted at /opt/etoperator and the project's virtualenv
    leads PATH (what the training image holds);
  - status: Running once started (workers: once sshd accepts connections), Succeeded/Failed
    with the exit code when the process ends; graceful deletion sends SIGTERM to the pod's
    init, waits the grace period, then SIGKILLs the whole pod.
What it cannot: resource limits, images, readiness probes, restarts in place, and ConfigMap
volume updates (written once at start; the operator never relies on them).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kubelet import SimKubelet, wait_port

SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
IMAGE_PATH = "/opt/etoperator"


def _items(
    data: dict[str, str], spec: dict[str, Any], binary: bool
) -> dict[str, tuple[bytes, int]]:
    mode = spec.get("defaultMode", 0o644)
    items = spec.get("items")
    out: dict[str, tuple[bytes, int]] = {}
    decode = (lambda v: base64.b64decode(v)) if binary else (lambda v: v.encode())
    if items:
        for it in items:
            if it["key"] in data:
                out[it["path"]] = (decode(data[it["key"]]), it.get("mode", mode))
    else:
        out = {k: (decode(v), mode) for k, v in data.items()}
    return out


@dataclass
class ProcessKubelet(SimKubelet):
    repo: Path = Path(".")
    venv_bin: Path = Path(".venv/bin")
    api_host: str = "127.0.0.1"
    api_port: int = 0
    ca: Path = Path(".")
    ssh_dirs: dict[tuple[str, str], tuple[Path, bytes]] = field(default_factory=dict)
    logs: dict[tuple[str, str], Path] = field(default_factory=dict)
    sshd_port: int = 2022
    envs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def next_ip(self) -> str:
        n = next(self._ip_seq)
        return f"127.20.{n // 250}.{n % 250 + 2}"

    def start(self) -> None:
        for path in ("/root/.ssh", "/etc/edl", SA_PATH, IMAGE_PATH):
            Path(path).mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        super().start()

    # -- volumes ------------------------------------------------------------------------------

    def _volume_dir(
        self, pod: dict[str, Any], vol: dict[str, Any], base: Path
    ) -> tuple[Path, bool] | None:
        ns = pod["metadata"]["namespace"]
        d = base / "volumes" / vol["name"]
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700 if "secret" in vol else 0o755)
        if "secret" in vol:
            obj = self.store.objects[("", "secrets")].get((ns, vol["secret"]["secretName"]))
            files = _items((obj or {}).get("data") or {}, vol["secret"], binary=True)
        elif "configMap" in vol:
            obj = self.store.objects[("", "configmaps")].get((ns, vol["configMap"]["name"]))
            files = _items((obj or {}).get("data") or {}, vol["configMap"], binary=False)
        else:
            return d, False
        if obj is None:
            return None
        for path, (content, mode) in files.items():
            (d / path).write_bytes(content)
            (d / path).chmod(mode)
        return d, "secret" in vol

    def _write_dns(self, ns: str) -> None:
        """Every pod of the namespace as a `Host` block, ahead of the Secret's own config."""
        hosts = "".join(
            f"Host {name}\n    HostName {ip}\n    Port {self.sshd_port}\n"
            for (pns, name), ip in sorted(self.ips.items())
            if pns == ns and (pns, name) in self.procs
        )
        for (pns, _), (d, original) in self.ssh_dirs.items():
            if pns == ns:
                cfg = d / "config"
                cfg.write_bytes(hosts.encode() + b"\n" + original)
                cfg.chmod(0o600)

    # -- pods ---------------------------------------------------------------------------------

    async def _start_pod(self, key: tuple[str, str], uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None:
            return
        ns, name = key
        ip = self.ips.setdefault(key, self.next_ip())
        base = self.workdir / ns / name
        base.mkdir(parents=True, exist_ok=True)
        container = pod["spec"]["containers"][0]
        mounts: list[tuple[Path, str]] = []
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for m in container.get("volumeMounts") or []:
            vol = volumes.get(m["name"])
            got = self._volume_dir(pod, vol, base) if vol else None
            if got is None:
                return  # a volume's source is missing: stays Pending, as on a real node
            d, is_secret = got
            mounts.append((d, m["mountPath"]))
            if m["mountPath"] == "/root/.ssh" and is_secret:
                original = (d / "config").read_bytes() if (d / "config").exists() else b""
                self.ssh_dirs[key] = (d, original)
        sa = base / "serviceaccount"
        sa.mkdir(exist_ok=True)
        (sa / "token").write_text(f"token-{ns}-{name}")
        (sa / "namespace").write_text(ns)
        (sa / "ca.crt").write_bytes(self.ca.read_bytes())
        mounts += [(sa, SA_PATH), (self.repo, IMAGE_PATH)]

        command = list(container.get("command") or []) + list(container.get("args") or [])
        if command and os.path.basename(command[0]) == "sshd":
            command += ["-o", f"ListenAddress={ip}:{self.sshd_port}", "-o", "PidFile=none"]
        env = {
            "PATH": f"{self.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": name,
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
        }
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
        self.envs[key] = env
        setup = "; ".join(
            f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in mounts
        )
        script = f"set -e; {setup}; cd /root; exec {shlex.join(command)}"
        log = base / "container.log"
        self.logs[key] = log
        proc = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--pid",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                "--kill-child=SIGKILL",
                "sh",
                "-c",
                script,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=open(log, "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[key] = proc
        self._write_dns(ns)
        if command and os.path.basename(command[0]) == "sshd":
            if not await wait_port(ip, self.sshd_port, 15):
                return
        if self._current(key, uid) is None:
            self._kill(key)
            return
        self._mark_running(key, ip, [container["name"]])
        asyncio.create_task(self._reap(key, uid, proc))

    async def _reap(self, key: tuple[str, str], uid: str, proc: subprocess.Popen[bytes]) -> None:
        code = await asyncio.to_thread(proc.wait)
        exit_code = 128 - code if code < 0 else code
        if self.procs.get(key) is proc:
            self.procs.pop(key, None)
        self.ssh_dirs.pop(key, None)
        self._write_dns(key[0])
        if self._current(key, uid) is None:
            return  # being deleted: the deletion path finishes it
        self._mark_terminated(key, exit_code)

    def _init_pid(self, proc: subprocess.Popen[bytes]) -> int | None:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def _kill(self, key: tuple[str, str]) -> None:
        proc = self.procs.pop(key, None)
        self.ssh_dirs.pop(key, None)
        if proc is None or proc.poll() is not None:
            return
        init = self._init_pid(proc)
        if init is not None:
            try:
                os.kill(init, signal.SIGTERM)
                proc.wait(3)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.emulator.loop.call_soon_threadsafe(self._write_dns, key[0])

    async def exec(self, namespace: str, name: str, argv: list[str]) -> tuple[int, bytes, bytes]:
        """pods/exec: the command joins the pod's mount and PID namespaces."""
        proc = self.procs.get((namespace, name))
        init = self._init_pid(proc) if proc is not None else None
        if init is None:
            return 126, b"", b"the container is not running\n"
        return await super().exec(
            namespace, name, ["nsenter", "-t", str(init), "-m", "-p", "--", *argv]
        )

    def exec_env(self, namespace: str, name: str) -> dict[str, str]:
        return self.envs.get((namespace, name), {})

    def crash(self, namespace: str, name: str) -> None:
        """SIGKILL the pod's init: its container dies (the pod then ends Failed, code 137)."""
        proc = self.procs.get((namespace, name))
        assert proc is not None, f"{name} runs no process"
        init = self._init_pid(proc)
        assert init is not None
        os.kill(init, signal.SIGKILL)
