"""A process kubelet: runs each pod's first container as real local processes.

What it maps, per pod:
  - processes: the container command (+ args) runs under `unshare --mount --pid`, so the pod
    has its own process table (`/proc`) and all of its processes die with it, as in a container;
  - network: the pod's IP is a loopback address of its own (127.20.x.y). A container whose
    command is sshd gets `-o ListenAddress=<podIP>:<port> -o PidFile=none` added, since every pod
    shares the machine's network stack;
  - name resolution: "cluster DNS" for ssh: every pod's /root/.ssh/config starts with one
    `Host <pod> / HostName <podIP> / Port <port>` block per pod of its namespace (port 2022 by
    default, so that an sshd of the machine's own on *:22 does not get in the way);
  - volumes, as a kubelet makes them: Secret and ConfigMap volumes (items, modes) and the
    projected service-account volume (a token from TokenRequest, the cluster CA from the
    kube-root-ca.crt ConfigMap, the namespace) are written to per-pod directories and
    bind-mounted at their mountPath. A Secret's directory is world-writable (a real kubelet's
    is a 0777 tmpfs), so the image's sshd must cope with that as it would on a cluster;
  - the image: the repository is bind-mounted at /opt/etoperator, the project's virtualenv leads
    PATH, and the training image's sshd_config (examples/image/sshd_config) is the pod's
    /etc/ssh/sshd_config;
  - status: Running once started (workers: once sshd accepts connections), Succeeded/Failed
    with the exit code when the process ends; graceful deletion sends SIGTERM to the pod's
    init, waits, then SIGKILLs the whole pod.
What it cannot: resource limits, images, readiness probes, restarts in place, and volume updates
(written once at start; the operator never relies on them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etoperator.localcluster import procs, volumes
from etoperator.localcluster.kubelet import Key, Kubelet, wait_port

SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
IMAGE_PATH = "/opt/etoperator"
SSHD_CONFIG = "/etc/ssh/sshd_config"
ROOT = Path(__file__).resolve().parents[2]
IMAGE_SSHD_CONFIG = ROOT / "examples" / "image" / "sshd_config"


@dataclass
class ProcessKubelet(Kubelet):
    repo: Path = ROOT
    venv_bin: Path = Path(".venv/bin")
    ssh_port: int = 2022  # the pods' sshd (not 22: the machine's own sshd may hold *:22)
    ip_prefix: str = "127.20"
    ssh_dirs: dict[Key, tuple[Path, bytes]] = field(default_factory=dict)
    logs: dict[Key, Path] = field(default_factory=dict)
    envs: dict[Key, dict[str, str]] = field(default_factory=dict)
    made_dirs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        # Empty mount points the pods' bind mounts need on this machine (removed at stop).
        for path in ("/root/.ssh", "/etc/edl", SA_PATH, IMAGE_PATH, "/run/sshd"):
            missing = [p for p in (Path(path), *Path(path).parents) if not p.exists()]
            Path(path).mkdir(parents=True, exist_ok=True)
            self.made_dirs += missing
        super().start()

    def stop(self) -> None:
        super().stop()
        for d in sorted(self.made_dirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()  # only if still empty

    def log_path(self, key: Key) -> Path | None:
        return self.logs.get(key)

    # -- volumes ------------------------------------------------------------------------------

    async def _mounts(self, node: str, key: Key, pod: dict[str, Any]) -> list[tuple[Path, str]]:
        base = self.workdir / key[0] / key[1] / "volumes"
        source = volumes.VolumeSource(self.client(node))
        fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        by_name = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: list[tuple[Path, str]] = []
        for m in pod["spec"]["containers"][0].get("volumeMounts") or []:
            vol = by_name.get(m["name"])
            if vol is None:
                continue
            d = base / vol["name"]
            files = await source.files(pod, vol)
            # A Secret/ConfigMap/projected volume is a 0777 tmpfs directory on a real node.
            volumes.write(d, files, 0o777)
            if fs_group is not None:
                _own(d, files, int(fs_group))
            mounts.append((d, m["mountPath"]))
            if m["mountPath"] == "/root/.ssh" and "secret" in vol:
                original = (d / "config").read_bytes() if (d / "config").exists() else b""
                self.ssh_dirs[key] = (d, original)
        return mounts

    def _write_dns(self, ns: str) -> None:
        """Every pod of the namespace as a `Host` block, ahead of the Secret's own config."""
        hosts = "".join(
            f"Host {name}\n    HostName {ip}\n    Port {self.ssh_port}\n"
            for (pns, name), ip in sorted(self.ips.items())
            if pns == ns and (pns, name) in self.procs
        )
        for (pns, _), (d, original) in list(self.ssh_dirs.items()):
            if pns == ns and d.exists():
                cfg = d / "config"
                mode = cfg.stat().st_mode & 0o777 if cfg.exists() else 0o600
                cfg.write_bytes(hosts.encode() + b"\n" + original)
                cfg.chmod(mode)

    # -- pods ---------------------------------------------------------------------------------

    async def run_pod(self, node: str, key: Key, pod: dict[str, Any], ip: str) -> bool:
        ns, name = key
        container = pod["spec"]["containers"][0]
        mounts = await self._mounts(node, key, pod)
        mounts += [(self.repo, IMAGE_PATH), (IMAGE_SSHD_CONFIG, SSHD_CONFIG)]
        command = list(container.get("command") or []) + list(container.get("args") or [])
        is_sshd = bool(command) and os.path.basename(command[0]) == "sshd"
        if is_sshd:
            command += ["-o", f"ListenAddress={ip}:{self.ssh_port}", "-o", "PidFile=none"]
        env = self._env(key, container)
        setup = "; ".join(
            f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in mounts
        )
        script = f"set -e; {setup}; cd /root; exec {shlex.join(command)}"
        log = self.workdir / ns / name / "container.log"
        self.logs[key] = log
        argv = [
            "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
            "--kill-child=SIGKILL", "sh", "-c", script,
        ]  # fmt: skip
        proc = procs.spawn(argv, log, env=env)
        self.procs[key] = proc
        self._write_dns(ns)
        if is_sshd and not await wait_port(ip, self.ssh_port, 15):
            return False
        self.spawn(self._reap(key, pod["metadata"]["uid"], proc))
        return True

    def _env(self, key: Key, container: dict[str, Any]) -> dict[str, str]:
        host, port = self.cp.url.removeprefix("https://").rsplit(":", 1)
        env = {
            "PATH": f"{self.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": key[1],
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
        }
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
        self.envs[key] = env
        return env

    async def _reap(self, key: Key, uid: str, proc: subprocess.Popen[bytes]) -> None:
        code = await asyncio.to_thread(proc.wait)
        exit_code = 128 - code if code < 0 else code
        if self.procs.get(key) is proc:
            self.procs.pop(key, None)
        self.ssh_dirs.pop(key, None)
        self._write_dns(key[0])
        if self.current(key, uid) is None:
            return  # being deleted: the deletion path finishes it
        await self.mark_terminated(key, exit_code)

    def _init_pid(self, proc: subprocess.Popen[bytes]) -> int | None:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def _kill(self, key: Key) -> None:
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
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._write_dns, key[0])

    async def exec(self, key: Key, argv: list[str]) -> tuple[int, bytes, bytes]:
        """pods/exec: the command joins the pod's mount and PID namespaces."""
        proc = self.procs.get(key)
        init = self._init_pid(proc) if proc is not None else None
        if init is None:
            return 126, b"", b"the container is not running\n"
        return await super().exec(key, ["nsenter", "-t", str(init), "-m", "-p", "--", *argv])

    def exec_env(self, key: Key) -> dict[str, str]:
        return self.envs.get(key, {})

    def crash(self, namespace: str, name: str) -> None:
        """SIGKILL the pod's init: its container dies (the pod then ends Failed, code 137)."""
        proc = self.procs.get((namespace, name))
        assert proc is not None, f"{name} runs no process"
        init = self._init_pid(proc)
        assert init is not None
        os.kill(init, signal.SIGKILL)


def _own(d: Path, files: volumes.Files, gid: int) -> None:
    """fsGroup, as the kubelet applies it: group ownership and group read on every file."""
    for path, (_, mode) in files.items():
        os.chown(d / path, 0, gid)
        (d / path).chmod(mode | 0o440)
