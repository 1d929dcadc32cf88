"""The operator as a process of this machine, under its ServiceAccount's token: started,
killed, restarted (warm: forked from a process that imported it already) and read."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import forkserver, procs
from localcluster.controlplane import ROOT

OPERATOR_NS = "etoperator-system"
OPERATOR_SA = "etoperator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"

MODULE = (sys.executable, "-m", "etoperator.cli")
FORK_SERVER = (sys.executable, "-m", "localcluster.forkserver")


@dataclass
class OperatorProcess:
    """The real operator (`etoperator run`) as a process of this machine."""

    kubeconfig: Path
    log: Path
    ssh_port: int
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = field(default_factory=procs.free_port)
    proc: procs.Process | None = None
    # A new process spends its first seconds importing its libraries (1.3-1.6 s of CPU; 5-9 s
    # on a loaded machine), and the tests restart the operator over a hundred times a run:
    # with `warm`, each start after the first is a fork of a server that imported them once
    # (localcluster/forkserver.py), the same command in a process of its own.
    warm: bool = False
    _server: tuple[subprocess.Popen[bytes], int, dict[str, str]] | None = None

    def start(self) -> None:
        """A new operator process: forked by the server with `warm` (unless it cannot), else
        one from nothing."""
        cmd = [
            "run",
            "--kubeconfig", str(self.kubeconfig),
            "--liveness", "",
            "--ssh-port", str(self.ssh_port),
            "--metrics-port", str(self.metrics_port),
            *self.extra,
        ]  # fmt: skip
        # KUBECONFIG as `main` sets it: the kubernetes library reads it as it is imported.
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "KUBECONFIG": str(self.kubeconfig),
            # Its token is this account's (deploy/rbac.yaml), as the Deployment says.
            "ETOPERATOR_SERVICE_ACCOUNT": f"{OPERATOR_NS}/{OPERATOR_SA}",
            **self.env,
        }
        forked = self._fork(cmd, env) if self.warm else None
        self.proc = forked or procs.spawn([*MODULE, *cmd], self.log, env=env, cwd=ROOT)

    def _fork(self, cmd: list[str], env: dict[str, str]) -> forkserver.Forked | None:
        """The operator forked by the server (started first, or again for another env);
        None if the server made none."""
        if self._server is None or self._server[2] != env or self._server[0].poll() is not None:
            self._stop_server()
            report, theirs = os.pipe()
            server = procs.spawn(
                [*FORK_SERVER, str(theirs)], self.log, env=env, cwd=ROOT,
                stdin=subprocess.PIPE, pass_fds=(theirs,),
            )  # fmt: skip
            os.close(theirs)
            self._server = (server, report, env)
        server, report, _ = self._server
        assert server.stdin is not None
        try:
            server.stdin.write(json.dumps(cmd).encode() + b"\n")
            server.stdin.flush()
        except BrokenPipeError:
            self._stop_server()
            return None
        pid = _read_line(report, timeout=60)  # its first fork waits on its imports
        if not pid:
            self._stop_server()
            return None
        return forkserver.Forked(int(pid), [*MODULE, *cmd])

    def _stop_server(self) -> None:
        if self._server is not None:
            server, report, _ = self._server
            procs.stop(server, grace=0)
            os.close(report)
            self._server = None

    def kill(self) -> None:
        """SIGKILL: no chance to tidy up, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def stop(self) -> None:
        procs.stop(self.proc)
        self._stop_server()

    def terminate(self) -> None:
        """SIGTERM, as a pod's deletion sends it; not waited for."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self) -> None:
        self.kill()
        self.start()

    def logged(self) -> int:
        """Where the log ends now: a `tail` since then shows only what came after."""
        return self.log.stat().st_size if self.log.exists() else 0

    def tail(self, n: int = 60, namespace: str | None = None, since: int = 0) -> str:
        """The log's last `n` lines written after byte `since`; with `namespace`, those of it
        and of no namespace (the operator's own: its starts, its stops), not another test's."""
        with self.log.open("rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
        if namespace is not None:
            lines = [ln for ln in lines if f"namespace={namespace}" in ln or "namespace=" not in ln]
        return "\n".join(lines[-n:])


def _read_line(fd: int, timeout: float) -> str:
    """A line from a pipe, or what came before its end or the deadline."""
    got = b""
    deadline = time.monotonic() + timeout
    while not got.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        got += chunk
    return got.decode().strip()
