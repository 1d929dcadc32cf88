"""Hollow nodes (kubemark, built from the Kubernetes module the control plane comes from): the
real kubelet's code over a fake container runtime, for benchmarks that need more pods than this
machine could run. Pods bound to them reach Running and stay there; nothing runs in them.

Each node is one `kubemark --morph=kubelet` process authenticating as `system:node:<name>`
(the Node authorizer and NodeRestriction apply, as for a real kubelet); kube-scheduler binds
pods to them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import procs
from localcluster.controlplane import ControlPlane

# A hollow kubelet reports every pod's status itself: at the client's default 10 requests a
# second, 500 pods on a node take a minute to show Running. A real node's kubelet is as limited,
# but it has far fewer pods.
API_QPS = 100
# kubemark keeps a node's files (tens of MB) and its fake runtime's socket in /tmp, whatever
# TMPDIR says, and never removes them: stop does, reading both paths from the node's log (the
# socket's is logged by the runtime client, at level 3 only: raised for that file alone).
# A hollow kubelet runs in this machine's network namespace, where the kubelet would add its
# iptables chains (KUBE-FIREWALL in INPUT and OUTPUT, canaries) and leave them: without
# iptables on its PATH it skips them, as on an nftables-only host. It needs no other tool.
PATH = "/usr/local/bin:/usr/bin:/bin"
LEFT_BEHIND = re.compile(
    rb"Using (/tmp/hollow-kubelet\.\d+) as root dir|endpoint=\"unix://(/tmp/kubelet_remote_\d+\.sock)\""
)


@dataclass
class HollowNodes:
    dir: Path
    count: int
    max_pods: int = 110
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @staticmethod
    def name(i: int) -> str:
        return f"hollow-{i}"

    def start(self, cp: ControlPlane) -> HollowNodes:
        for i in range(self.count):
            name = self.name(i)
            kc = cp.user_kubeconfig(f"kubelet-{name}", f"system:node:{name}", ("system:nodes",))
            argv = [
                str(cp.bin / "kubemark"),
                "--morph=kubelet",
                f"--name={name}",
                f"--kubeconfig={kc}",
                f"--kubelet-port={procs.free_port()}",
                "--kubelet-read-only-port=0",
                f"--max-pods={self.max_pods}",
                "--use-host-image-service=false",
                f"--kube-api-qps={API_QPS}",
                f"--kube-api-burst={2 * API_QPS}",
                "--v=0",
                "--vmodule=remote_runtime=3",
            ]
            env = {**os.environ, "PATH": PATH}
            # Lowest CPU priority: on a cluster, kubelets run on machines of their own and
            # take nothing from the control plane and the operator; here they share 2 cores.
            log = self.dir / f"{name}.log"
            self.procs.append(procs.spawn(argv, log, env, cwd=self.dir, nice=19))
        return self

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            procs.stop(p)
        self.procs.clear()
        for log in self.dir.glob("*.log"):
            for match in LEFT_BEHIND.finditer(log.read_bytes()):
                path = Path((match[1] or match[2]).decode())
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
