"""A whole local cluster: the control plane, the operator's CRDs and RBAC from deploy/, a
kubelet, and the operator itself running under its ServiceAccount's token."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from etoperator.localcluster import procs
from etoperator.localcluster.controlplane import ROOT, ControlPlane
from etoperator.localcluster.kubelet import Kubelet

OPERATOR_NS = "etoperator-system"
OPERATOR_SA = "etoperator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
CRDS = ("trainingjobs", "scaleouts", "scaleins")


class KubectlFailed(AssertionError):
    """A kubectl call that had to succeed did not; the message has its stderr."""


@dataclass
class OperatorProcess:
    """The real operator (`etoperator run`) as a child process."""

    kubeconfig: Path
    log: Path
    ssh_port: int
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = field(default_factory=procs.free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "etoperator.cli", "run",
            "--kubeconfig", str(self.kubeconfig),
            "--liveness", "",
            "--ssh-port", str(self.ssh_port),
            "--metrics-port", str(self.metrics_port),
            *self.extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = procs.spawn(cmd, self.log, env=env, cwd=ROOT)

    def kill(self) -> None:
        """SIGKILL: no chance to tidy up, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def stop(self) -> None:
        procs.stop(self.proc)

    def restart(self) -> None:
        self.kill()
        self.start()

    def tail(self, n: int = 60) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


@dataclass
class LocalCluster:
    dir: Path
    make_kubelet: Callable[[ControlPlane], Kubelet]
    ssh_port: int
    operator_args: list[str] = field(default_factory=list)
    api_port: int = 0
    progress: Callable[[str], None] = lambda _: None
    cp: ControlPlane | None = None
    kubelet: Kubelet | None = None
    operator: OperatorProcess | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.cp is not None
        return self.cp.admin_kubeconfig

    def run_kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl of the control plane's version, as the cluster's admin."""
        assert self.cp is not None
        res = subprocess.run(
            [str(self.cp.kubectl_path()), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )
        if check and res.returncode != 0:
            raise KubectlFailed(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
        return res

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.run_kubectl(*args, input=input, check=check).stdout

    def start(self, operator: bool = True, server: str | None = None) -> LocalCluster:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cp = ControlPlane(self.dir / "controlplane", port=self.api_port)
        self.cp.start(before_controllers=self.install)
        self.progress(f"control plane up at {self.cp.url}")
        self.kubelet = self.make_kubelet(self.cp)
        self.kubelet.start()
        self.progress("kubelet up")
        if operator:
            self.start_operator(server)
        return self

    def start_operator(self, server: str | None = None) -> OperatorProcess:
        """The operator, reaching the apiserver at `server` (default: directly)."""
        self.operator = OperatorProcess(
            self.operator_kubeconfig(server), self.dir / "operator.log", self.ssh_port,
            extra=list(self.operator_args),
        )  # fmt: skip
        self.operator.start()
        self.progress("operator started")
        return self.operator

    def install(self) -> None:
        """The CRDs and the operator's namespace, ServiceAccount and RBAC, as deploy/ has them."""
        self.kubectl("apply", "-k", str(ROOT / "crds"))
        for doc in ("namespace.yaml", "rbac.yaml"):
            self.kubectl("apply", "-f", str(ROOT / "deploy" / doc))
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{c}.kai.alibabacloud.com" for c in CRDS),
        )  # fmt: skip

    def operator_kubeconfig(self, server: str | None = None) -> Path:
        """A kubeconfig with a token of the operator's ServiceAccount (RBAC applies to it)."""
        assert self.cp is not None
        token = self.kubectl(
            "create", "token", OPERATOR_SA, "-n", OPERATOR_NS, "--duration=48h"
        ).strip()
        return self.cp.token_kubeconfig(token, self.dir / "operator.kubeconfig", server)

    def wait_namespace_ready(self, ns: str) -> None:
        """A namespace's default ServiceAccount and root CA exist (pods need both)."""
        procs.wait_until(
            lambda: self.kubectl("get", "sa/default", "cm/kube-root-ca.crt", "-n", ns,
                                 "-o", "name", check=False).count("\n") == 2,
            f"namespace {ns}", 30,
        )  # fmt: skip

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.cp is not None:
            self.cp.stop()
