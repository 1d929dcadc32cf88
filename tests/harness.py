"""Shared test plumbing: the emulator + kubelet + operator process, and waiting helpers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from etoperator import kube, naming
from tests.emulator.server import Emulator
from tests.kubelet import SimKubelet

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(
    fn: Callable[[], T], timeout: float = 20.0, what: str = "condition", interval: float = 0.05
) -> T:
    """Poll `fn` until it returns something truthy; fail with the last value after `timeout`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except (kube.ApiError, KeyError, IndexError, TypeError) as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    """The real operator (`etoperator run`) as a child process."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        ssh_port: int,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig, self.log, self.ssh_port = kubeconfig, log, ssh_port
        self.extra = extra or []
        self.env = env or {}
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "etoperator.cli",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--liveness",
            "",
            "--ssh-port",
            str(self.ssh_port),
            "--metrics-port",
            str(self.metrics_port),
            *self.extra,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            cmd,
            stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: no chance to tidy up, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def tail(self, n: int = 60) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


OPERATOR_TOKEN = "etoperator"  # the operator's own identity, so its requests can be audited


def start_cluster(
    tmp: Path,
    make_kubelet: Callable[[Emulator], SimKubelet],
    ssh_port: int,
    extra: list[str] | None = None,
) -> Cluster:
    """The API emulator, a kubelet, and the operator as a real process, all on this machine."""
    emulator = Emulator(ROOT / "crds")
    emulator.start(tmp / "tls")
    kubeconfig = emulator.kubeconfig(tmp / "kubeconfig")
    kubelet = make_kubelet(emulator)
    kubelet.start()
    operator_kc = emulator.kubeconfig(tmp / "operator.kubeconfig", token=OPERATOR_TOKEN)
    operator = OperatorProcess(operator_kc, tmp / "operator.log", ssh_port, extra=extra)
    operator.start()
    api = kube.Kube(kube.load_config(str(kubeconfig)))
    return Cluster(emulator, kubelet, operator, kubeconfig, api)


@dataclass
class Cluster:
    emulator: Emulator
    kubelet: SimKubelet
    operator: OperatorProcess
    kubeconfig: Path
    api: kube.Kube

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}")
        return res

    def kubectl_create(self, ns: str, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """`kubectl create -f -` as a user would (the emulator serves no OpenAPI document)."""
        return self.kubectl(
            "create",
            "--validate=false",
            "-n",
            ns,
            "-f",
            "-",
            input=yaml.safe_dump(manifest),
            check=False,
        )

    def stop(self) -> None:
        self.operator.stop()
        self.kubelet.stop()
        self.emulator.stop()

    def new_namespace(self) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        store = self.emulator.store
        self.emulator.call(
            lambda: store.create(
                store.resources[("", "namespaces")], None, {"metadata": {"name": name}}
            )
        )
        return name

    # -- reading the world ----------------------------------------------------------------

    def obj(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        """An object that must exist."""
        got = self.api.get(kind, ns, name)
        assert got is not None, f"{kind} {ns}/{name} is gone"
        return got

    def job(self, ns: str, name: str) -> dict[str, Any]:
        obj = self.api.get(naming.JOB_KIND, ns, name)
        assert obj is not None, f"job {ns}/{name} is gone"
        return obj

    def status(self, ns: str, name: str, kind: str = naming.JOB_KIND) -> dict[str, Any]:
        obj = self.api.get(kind, ns, name)
        return (obj or {}).get("status") or {}

    def phase(self, ns: str, name: str, kind: str = naming.JOB_KIND) -> str:
        return str(self.status(ns, name, kind).get("phase") or "")

    def pods(self, ns: str, job: str, role: str | None = None, live: bool = True) -> list[str]:
        labels = {naming.LABEL_JOB: job}
        if role:
            labels[naming.LABEL_ROLE] = role
        pods = self.api.list("Pod", ns, naming.selector(labels))
        if live:
            pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return sorted(p["metadata"]["name"] for p in pods)

    def hosts(self, ns: str, job: str) -> list[str]:
        cm = self.api.get("ConfigMap", ns, naming.config_map_name(job))
        text = ((cm or {}).get("data") or {}).get(naming.HOSTFILE_KEY, "")
        return [line.rsplit(":", 1)[0] for line in text.splitlines() if line]

    def events(self, ns: str, name: str | None = None) -> list[dict[str, Any]]:
        evs = self.api.list("Event", ns)
        return [e for e in evs if name is None or e["involvedObject"].get("name") == name]

    def event_reasons(self, ns: str, name: str) -> list[str]:
        return [e["reason"] for e in self.events(ns, name)]

    def condition(
        self, ns: str, name: str, ctype: str, kind: str = naming.JOB_KIND
    ) -> dict[str, Any] | None:
        for c in self.status(ns, name, kind).get("conditions") or []:
            if c.get("type") == ctype:
                return dict(c)
        return None

    # -- writing ----------------------------------------------------------------------------

    def create(self, manifest: dict[str, Any] | str, ns: str) -> dict[str, Any]:
        obj = yaml.safe_load(manifest) if isinstance(manifest, str) else manifest
        obj.setdefault("metadata", {})["namespace"] = ns
        return self.api.create(obj)
