"""spec.sharedVolume: the claim the operator makes for a job, and its mount in each worker.
Pure."""

from __future__ import annotations

import shlex
from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders.common import Owner, init_like, metadata


def shared_claim(spec: JobSpec, owner: Owner) -> dict[str, Any]:
    """ReadWriteMany: every worker, on any node, reads and writes the same checkpoints. Owned
    by the job: the garbage collector deletes it with the job, never before (runs come and go
    and each resumes from it)."""
    assert spec.shared is not None
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": spec.shared.storage}},
    }
    if spec.shared.storage_class:
        claim["storageClassName"] = spec.shared.storage_class
    name = naming.shared_claim_name(spec.name)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(name, spec.namespace, owner, naming.job_labels(spec.name)),
        "spec": claim,
    }


def mount_shared(spec: JobSpec, pod: dict[str, Any]) -> dict[str, Any]:
    """The `pod` (a worker, a launcher) with the shared claim mounted in its first container
    and its path in CHECKPOINT_DIR (the template's own value of it stays)."""
    if spec.shared is None:
        return pod
    pod_spec = pod["spec"]
    volume = {
        "name": naming.SHARED_VOLUME,
        "persistentVolumeClaim": {"claimName": naming.shared_claim_name(spec.name)},
    }
    others = [v for v in pod_spec.get("volumes") or [] if v.get("name") != naming.SHARED_VOLUME]
    pod_spec["volumes"] = [*others, volume]
    first = pod_spec["containers"][0]
    mounts = [m for m in first.get("volumeMounts") or [] if m.get("name") != naming.SHARED_VOLUME]
    first["volumeMounts"] = [
        *mounts,
        {"name": naming.SHARED_VOLUME, "mountPath": spec.shared.mount_path},
    ]
    return checkpoint_env(spec, pod)


def checkpoint_env(spec: JobSpec, pod: dict[str, Any]) -> dict[str, Any]:
    """CHECKPOINT_DIR, the claim's path in the workers, in the first container (the template's
    own value stays). Also a Horovod launcher's: horovodrun starts the ranks over SSH with
    its own environment, not the worker container's."""
    if spec.shared is None:
        return pod
    env = pod["spec"]["containers"][0].setdefault("env", [])
    if not any(e.get("name") == naming.CHECKPOINT_ENV for e in env):
        env.append({"name": naming.CHECKPOINT_ENV, "value": spec.shared.mount_path})
    return pod


def save_hook(
    directory: str, wait: int = naming.SAVE_WAIT, report: str = "/dev/termination-log"
) -> dict[str, Any]:
    """The launcher's preStop, the save handshake: every stop of a run deletes its launcher
    first of all (a suspension, an eviction, a launcher restart, the job deleted), so before
    the kubelet stops it, a save is asked of the training (the request touched) and waited for
    up to `wait` seconds: a report newer than the request, which becomes the container's
    termination message (the job's status.lastSaved). No wait where no script honours it
    (no marker)."""
    d = shlex.quote(directory)
    script = (
        f'd={d}; r="$d/{naming.SAVE_REQUEST}"; '
        f'[ -e "$d/{naming.SAVE_MARKER}" ] || exit 0; touch "$r" || exit 0; i=0; '
        f"while [ $i -lt {wait * 5} ]; do "
        f'if [ -n "$(find "$d" -maxdepth 1 -name {naming.SAVE_REPORT} -newer "$r")" ]; then '
        f'cat "$d/{naming.SAVE_REPORT}" > {shlex.quote(report)}; exit 0; fi; '
        "sleep 0.2; i=$((i+1)); done"
    )
    return {"exec": {"command": ["sh", "-c", script]}}


def launcher_saves(spec: JobSpec, pod: dict[str, Any]) -> dict[str, Any]:
    """A launcher with the shared volume mounted (as the workers have it) and the save
    handshake as its preStop (a hook of the template's own stays)."""
    if spec.shared is None:
        return pod
    pod = mount_shared(spec, pod)
    first = pod["spec"]["containers"][0]
    first.setdefault("lifecycle", {}).setdefault("preStop", save_hook(spec.shared.mount_path))
    inits = [c for c in pod["spec"].get("initContainers") or [] if c.get("name") != LAST_SAVE]
    pod["spec"]["initContainers"] = [*inits, last_save(spec, first)]
    return pod


LAST_SAVE = "last-save"


def last_save(spec: JobSpec, first: dict[str, Any]) -> dict[str, Any]:
    """An init container of the launcher: the last save reported on the shared volume, as its
    termination message. A stop's report is its launcher's own termination message, gone
    with the pod: with the operator down until then, the job's next run says it again."""
    assert spec.shared is not None
    report = shlex.quote(f"{spec.shared.mount_path}/{naming.SAVE_REPORT}")
    script = f"cat {report} > /dev/termination-log 2>/dev/null; exit 0"
    init = init_like(first, LAST_SAVE, ["sh", "-c", script])
    mount = {"name": naming.SHARED_VOLUME, "mountPath": spec.shared.mount_path, "readOnly": True}
    init["volumeMounts"] = [mount]
    return init
