"""Cluster DNS: CoreDNS (built from its Go module) with its kubernetes plugin, answering on the
network's gateway address, so that a headless Service's name resolves to its pods' IPs in
every pod (the kubelet writes that address into each pod's resolv.conf)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import procs
from localcluster.controlplane import ControlPlane

USER = "etoperator-local:coredns"
# What CoreDNS's kubernetes plugin reads (its own deployment's ClusterRole).
RBAC = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "etoperator-local:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "etoperator-local:coredns"}}
roleRef:
  {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "etoperator-local:coredns"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{USER}"}}]
"""


def corefile(address: str, kubeconfig: Path) -> str:
    # No cache: a worker's name must resolve as soon as its Service lists it.
    return f""".:53 {{
    bind {address}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 1
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""


@dataclass
class ClusterDNS:
    cp: ControlPlane
    coredns: Path
    address: str
    dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None)

    def start(self) -> ClusterDNS:
        self.dir.mkdir(parents=True, exist_ok=True)
        kc = self.cp.user_kubeconfig("coredns", USER)
        cfg = self.dir / "Corefile"
        cfg.write_text(corefile(self.address, kc))
        self.proc = procs.spawn(
            [str(self.coredns), "-conf", str(cfg)], self.dir / "coredns.log", procs.go_env()
        )
        procs.wait_until(self._answers, "CoreDNS", 30, self.proc, self.dir / "coredns.log")
        return self

    def _answers(self) -> bool:
        """The server answers a query for the apiserver's Service (any answer will do)."""
        query = (
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
            b"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01"
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.5)
            try:
                s.sendto(query, (self.address, 53))
                return s.recv(512)[:2] == b"\x12\x34"
            except OSError:
                return False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Cluster DNS answers nothing meanwhile (stopped, not ended), as while it cannot
        reach the apiserver or is being replaced."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        procs.stop(self.proc)
