"""Jobs and scalers as the tests and the benchmarks make them: pods of the training image that
hold until a test ends them (see the gates below), on the local cluster's real nodes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from etoperator.naming import API_VERSION

IMAGE = "etoperator/train:latest"
PODINFO = "/etc/podinfo"
EXIT_FILE = "/tmp/exit-code"  # a test ends a container by writing its exit code here
GATE_PID = "/tmp/gate.pid"  # ... then signalling the gate (SIGUSR1), whose pid this holds
# Annotations a test sets on a worker while it is held Pending, read once when it starts
# (the downward API volume is written before the container runs).
EXIT_AT_START = "test-exit-at-start"  # its container ends at once with this code
REFUSE_KEY = "test-refuse-key"  # its sshd trusts no key until the test copies the job's in
REFUSED_KEYS = "/run/test-keys/authorized_keys"
# The wait sleeps until signalled: a loop of `sleep 0.1` in every pod was 40 processes a
# second beside the suite (2 ms of CPU each). The file is read once more after the pid is
# written, for a test that ended the pod before its gate was there to be signalled. (Its pid
# is its child's parent: a container's command would read `$$` as an escaped `$`.)
_WAIT = (
    "trap 'exit 143' TERM\n"
    f"trap 'exit \"$(cat {EXIT_FILE})\"' USR1\n"
    f"sh -c 'echo \"$PPID\"' > {GATE_PID}\n"
    f'[ -e {EXIT_FILE} ] && exit "$(cat {EXIT_FILE})"\n'
    "while :; do sleep 86400 & wait $!; done\n"
)
# A worker: the image's sshd (as the operator's default worker command runs it) beside a wait.
WORKER_GATE = (
    f"a={PODINFO}/annotations\n"
    f'code=$(sed -n \'s/^{EXIT_AT_START}="\\([0-9]*\\)"$/\\1/p\' "$a")\n'
    'if [ -n "$code" ]; then exit "$code"; fi\n'
    f'if grep -qx \'{REFUSE_KEY}="true"\' "$a"; then\n'
    f"  mkdir -p {REFUSED_KEYS.rsplit('/', 1)[0]}\n"
    f"  /usr/sbin/sshd -D -e -o AuthorizedKeysFile={REFUSED_KEYS} &\n"
    "else\n"
    "  /usr/sbin/sshd -D -e &\n"
    "fi\n" + _WAIT
)
# A launcher: it runs nothing but the wait (the full chain runs real training).
LAUNCHER_GATE = _WAIT


def container(name: str, gate: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", gate],
    }


def job(name: str, replicas: int = 2, shared: Path | None = None, **spec: Any) -> dict[str, Any]:
    """A job of the gates below; `shared`: a directory of this machine the launcher sees at
    the same path (a hostPath volume: scaler scripts the test writes, what they write back)."""
    worker: dict[str, Any] = {
        "replicas": replicas,
        "template": {"spec": worker_pod()},
    }
    for key in ("minReplicas", "maxReplicas"):
        if key in spec:
            worker[key] = spec.pop(key)
    if "workerRestartPolicy" in spec:
        worker["restartPolicy"] = spec.pop("workerRestartPolicy")
    launcher: dict[str, Any] = {
        "template": {"spec": {"containers": [container("launcher", LAUNCHER_GATE)]}}
    }
    if shared is not None:
        pod = launcher["template"]["spec"]
        pod["volumes"] = [
            {"name": "shared", "hostPath": {"path": str(shared), "type": "Directory"}}
        ]
        pod["containers"][0]["volumeMounts"] = [{"name": "shared", "mountPath": str(shared)}]
    if "launcherRestartPolicy" in spec:
        launcher["restartPolicy"] = spec.pop("launcherRestartPolicy")
    annotations = spec.pop("annotations", None)
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"etReplicaSpecs": {"launcher": launcher, "worker": worker}, **spec},
    }
    if annotations:
        body["metadata"]["annotations"] = annotations
    return copy.deepcopy(body)


def worker_pod() -> dict[str, Any]:
    """The worker gate, with the pod's annotations mounted for it to read."""
    c = container("worker", WORKER_GATE)
    c["volumeMounts"] = [{"name": "podinfo", "mountPath": PODINFO, "readOnly": True}]
    items = [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
    return {
        "containers": [c],
        "volumes": [{"name": "podinfo", "downwardAPI": {"items": items}}],
        # A pod's gate ends at once on SIGTERM; a hung one is not waited for long.
        "terminationGracePeriodSeconds": 5,
    }


def _scaler(kind: str, name: str, spec: dict[str, Any], timeout: int | None) -> dict[str, Any]:
    if timeout is not None:
        spec["timeout"] = timeout
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


def scaleout(name: str, job_name: str, count: int, timeout: int | None = None) -> dict[str, Any]:
    return _scaler(
        "ScaleOut", name, {"selector": {"name": job_name}, "toAdd": {"count": count}}, timeout
    )


def scalein(
    name: str,
    job_name: str,
    count: int | None = None,
    pod_names: list[str] | None = None,
    timeout: int | None = None,
) -> dict[str, Any]:
    to_delete: dict[str, Any] = {}
    if count is not None:
        to_delete["count"] = count
    if pod_names is not None:
        to_delete["podNames"] = pod_names
    return _scaler(
        "ScaleIn", name, {"selector": {"name": job_name}, "toDelete": to_delete}, timeout
    )


TORCHRUN_TRAIN = "/opt/etoperator/examples/torchrun/train.py"


SHARED = {"storageClassName": "shared", "storage": "1Gi"}  # localcluster/storage.py


def torchrun_job(name: str, replicas: int, args: list[str], **worker: Any) -> dict[str, Any]:
    """A Torchrun job of the example script (examples/torchrun/train.py) under torchrun,
    saving to the job's shared volume (a claim of the local cluster's StorageClass `shared`);
    `worker`: minReplicas, maxReplicas, restartPolicy."""
    c = {
        "name": "worker",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["torchrun", TORCHRUN_TRAIN, *args],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "runtime": "Torchrun",
            "sharedVolume": dict(SHARED),
            "etReplicaSpecs": {
                "worker": {
                    "replicas": replicas,
                    "template": {"spec": {"containers": [c]}},
                    **worker,
                }
            },
        },
    }
