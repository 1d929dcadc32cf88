"""Dynamic provisioning of ReadWriteMany volumes on the local cluster: the real local-path
provisioner (hack/build-storage.sh builds it from its module), as a process beside the control
plane, in its shared-filesystem mode.

A claim of StorageClass `shared` gets a directory under this cluster's `volumes/`, made by the
provisioner's helper pod as it does on any cluster. Every local node shares this machine's
disk (their mount namespaces are slaves of its), so a volume is the same directory on every
node: what an NFS export or a cloud file share mounted on each node gives a real cluster.
The helper pods run the training image (it has the shell the setup script needs).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from localcluster import procs
from localcluster.controlplane import ROOT, ControlPlane

BUILD = ROOT / "hack" / "build-storage.sh"
NAMESPACE = "local-path-storage"
ACCOUNT = "local-path-provisioner"
PROVISIONER = "rancher.io/local-path"
STORAGE_CLASS = "shared"
HELPER_IMAGE = "etoperator/train:latest"
SETUP = 'set -eu\nmkdir -m 0777 -p "$VOL_DIR"\n'
TEARDOWN = 'set -eu\nrm -rf "$VOL_DIR"\n'


def built() -> Path:
    env = os.environ.get("ETOPERATOR_STORAGE_DIR")
    return Path(env) if env else procs.built(BUILD)


def objects(helper: str) -> list[dict[str, object]]:
    """What an administrator's install of the provisioner makes, but its Deployment."""
    meta = {"name": ACCOUNT, "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "local-path-config", "namespace": NAMESPACE},
            "data": {"setup": SETUP, "teardown": TEARDOWN, "helperPod.yaml": helper},
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    ]


def helper_pod() -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "containers": [
                {"name": "helper-pod", "image": HELPER_IMAGE, "imagePullPolicy": "IfNotPresent"}
            ]
        },
    }
    return yaml.safe_dump(pod)


@dataclass
class Storage:
    dir: Path
    cp: ControlPlane
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "local-path.log"

    def start(self) -> Storage:
        self.dir.mkdir(parents=True, exist_ok=True)
        volumes = self.dir / "volumes"
        volumes.mkdir(exist_ok=True)
        helper = helper_pod()
        (self.dir / "helperPod.yaml").write_text(helper)
        (self.dir / "config.json").write_text(json.dumps({"sharedFileSystemPath": str(volumes)}))
        self._kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects(helper)))
        # The administrator's provisioner: cluster-wide rights, as its ClusterRole grants.
        kc = self.cp.user_kubeconfig("local-path", "local-path", ("system:masters",))
        self.proc = procs.spawn(
            [
                str(built() / "bin" / "local-path-provisioner"), "start",
                f"--kubeconfig={kc}", f"--namespace={NAMESPACE}",
                f"--config={self.dir / 'config.json'}",
                f"--helper-pod-file={self.dir / 'helperPod.yaml'}",
                f"--service-account-name={ACCOUNT}", f"--provisioner-name={PROVISIONER}",
                f"--helper-image={HELPER_IMAGE}",
            ],
            self.log,
            env=procs.go_env(dict(os.environ)),
        )  # fmt: skip
        return self

    def stop(self) -> None:
        procs.stop(self.proc)

    def _kubectl(self, *args: str, input: str | None = None) -> None:
        subprocess.run(
            [str(self.cp.kubectl_path()), "--kubeconfig", str(self.cp.admin_kubeconfig), *args],
            input=input, text=True, check=True, capture_output=True,
        )  # fmt: skip
