"""Worker and launcher pods, and the per-worker headless services. Pure: inputs are never
mutated (templates are deep-copied) and nothing is read from globals or the clock."""

from __future__ import annotations

import copy
import os
import shlex
from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders import gang, ssh
from etoperator.builders.common import ANYWHERE, Owner, Placement, metadata

SSH_VOLUME = naming.SSH_VOLUME
CONFIG_VOLUME = naming.CONFIG_VOLUME
# sshd in the foreground, logging to stderr: what a worker runs when its template gives no command.
DEFAULT_WORKER_COMMAND = ["/usr/sbin/sshd", "-D", "-e"]
SSH_MODE = 0o600
SCRIPT_MODE = 0o755
FILE_MODE = 0o644


def _ssh_volume(secret: str, keys: frozenset[str]) -> dict[str, Any]:
    """`keys`: those the Secret holds. Without authorized_keys (a user's Secret may lack it)
    the public key is trusted alone."""
    trusted = ssh.AUTHORIZED_KEYS if ssh.AUTHORIZED_KEYS in keys else ssh.PUBLIC_KEY
    items = [
        {"key": ssh.PRIVATE_KEY, "path": ssh.PRIVATE_KEY},
        {"key": ssh.PUBLIC_KEY, "path": ssh.PUBLIC_KEY},
        {"key": trusted, "path": ssh.AUTHORIZED_KEYS},
    ]
    if ssh.CONFIG in keys:
        items.append({"key": ssh.CONFIG, "path": ssh.CONFIG})
    return {
        "name": SSH_VOLUME,
        "secret": {"secretName": secret, "defaultMode": SSH_MODE, "items": items},
    }


HOROVOD_CONFIG = (naming.DISCOVER_KEY, naming.HOSTFILE_KEY, naming.DEEPSPEED_KEY)


def config_volume(job: str, keys: tuple[str, ...] = HOROVOD_CONFIG) -> dict[str, Any]:
    """The job's ConfigMap, its `keys` as files. Readable by a non-root launcher: the
    discovery script is 0755, the rest 0644."""
    return {
        "name": CONFIG_VOLUME,
        "configMap": {
            "name": naming.config_map_name(job),
            "items": [
                {
                    "key": k,
                    "path": k,
                    "mode": SCRIPT_MODE if k == naming.DISCOVER_KEY else FILE_MODE,
                }
                for k in keys
            ],
        },
    }


def config_mount() -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "mountPath": naming.CONFIG_MOUNT}


def with_volumes(
    template: dict[str, Any], volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """The template's pod spec with our volumes added (replacing any of the same name)."""
    spec = copy.deepcopy(template.get("spec") or {})
    ours = {v["name"] for v in volumes}
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") not in ours] + volumes
    containers = spec["containers"]
    first = containers[0]
    paths = {m["mountPath"] for m in mounts}
    kept = [
        m
        for m in first.get("volumeMounts") or []
        if m.get("name") not in ours and m.get("mountPath") not in paths
    ]
    first["volumeMounts"] = kept + mounts
    spec["restartPolicy"] = "Never"
    return spec


def pod_of(
    name: str,
    job_spec: JobSpec,
    owner: Owner,
    template: dict[str, Any],
    labels: dict[str, str],
    spec: dict[str, Any],
) -> dict[str, Any]:
    tmeta = template.get("metadata") or {}
    # A pod is admitted with its job: Kueue must never queue it on its own.
    own = {k: v for k, v in (tmeta.get("labels") or {}).items() if k != naming.LABEL_QUEUE}
    meta = metadata(
        name, job_spec.namespace, owner, {**own, **labels}, dict(tmeta.get("annotations") or {})
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def find_horovod(hostname: str) -> str:
    """POSIX sh that sets $pids to the processes carrying HOROVOD_HOSTNAME=<hostname> (what
    Horovod sets in each training process it starts there; matched whole, so `worker-1`
    never matches `worker-10`). One grep reads every process's environment where grep reads
    NUL-separated lines (-z); elsewhere a tr and a grep a process, slow on a loaded node."""
    needle = shlex.quote(f"HOROVOD_HOSTNAME={hostname}")
    return (
        'pids=""; '
        "if printf 'a\\0' | grep -qxzF a 2>/dev/null; then "
        f"for e in $(grep -lsxzF -- {needle} /proc/[0-9]*/environ); do "
        'p="${e#/proc/}"; pids="$pids ${p%/environ}"; done; '
        "else for e in /proc/[0-9]*/environ; do "
        f"if tr '\\0' '\\n' 2>/dev/null < \"$e\" | grep -qxF -- {needle}; then "
        'p="${e#/proc/}"; pids="$pids ${p%/environ}"; fi; done; fi'
    )


def drain_hook(hostname: str) -> dict[str, Any]:
    """A worker's preStop: whoever deletes it (a ScaleIn, `kubectl drain`, an eviction), its
    processes are stopped only once Horovod has let go of it. The operator takes a deleted
    worker out of the host list at once; Horovod then ends its training process there at its
    next reset. Bounded by the pod's grace period, as every hook is."""
    return {
        "exec": {
            "command": [
                "sh",
                "-c",
                f'while :; do {find_horovod(hostname)}; [ -n "$pids" ] || exit 0; sleep 0.2; done',
            ]
        }
    }


def worker_pod(
    job_spec: JobSpec,
    owner: Owner,
    index: int,
    secret: str,
    secret_items: frozenset[str],
    placement: Placement = ANYWHERE,
) -> dict[str, Any]:
    name = naming.worker_name(job_spec.name, index)
    spec = with_volumes(
        job_spec.worker.template,
        [_ssh_volume(secret, secret_items)],
        [{"name": SSH_VOLUME, "mountPath": naming.SSH_MOUNT}],
    )
    first = spec["containers"][0]
    if not first.get("command"):
        first["command"] = list(DEFAULT_WORKER_COMMAND)
        first.pop("args", None)
    lifecycle = first.setdefault("lifecycle", {})
    lifecycle.setdefault("preStop", drain_hook(name))  # a hook of the template's own stays
    if spec.get("hostNetwork"):
        claim_ssh_port(first, naming.SERVICE_PORTS[0])
    spec.setdefault("hostname", name)
    placement.apply(spec)
    gang.place(job_spec, spec, worker=True)
    return pod_of(
        name,
        job_spec,
        owner,
        job_spec.worker.template,
        naming.worker_labels(job_spec.name, index),
        spec,
    )


def claim_ssh_port(container: dict[str, Any], port: int) -> None:
    """A worker on the node's network runs its sshd on the node's port: declared as the
    container's (a host port, with hostNetwork), so the scheduler never puts two on one node
    (the second sshd could not bind, and the job sat Created without a word)."""
    ports = container.setdefault("ports", [])
    if not any(p.get("containerPort") == port for p in ports):
        ports.append({"name": "ssh", "containerPort": port, "protocol": "TCP"})


def launcher_pod(
    job_spec: JobSpec,
    owner: Owner,
    secret: str,
    secret_items: frozenset[str],
    run: int,
    placement: Placement = ANYWHERE,
) -> dict[str, Any]:
    """The launcher of run `run` (the job's restartCount): the run is stamped on the pod so a
    launcher left over from an earlier run is never taken for the current one."""
    spec = with_volumes(
        job_spec.launcher.template,
        [_ssh_volume(secret, secret_items), config_volume(job_spec.name)],
        [
            {"name": SSH_VOLUME, "mountPath": naming.SSH_MOUNT},
            config_mount(),
        ],
    )
    spec["serviceAccountName"] = launcher_service_account(job_spec, job_spec.launcher.template)
    # The discovery script reads the live host list with this account's token.
    spec["automountServiceAccountToken"] = True
    env = spec["containers"][0].setdefault("env", [])
    ours = {"ETOPERATOR_JOB": job_spec.name, "ETOPERATOR_NAMESPACE": job_spec.namespace}
    env[:] = [e for e in env if e.get("name") not in ours]
    env.extend({"name": k, "value": v} for k, v in ours.items())
    given = {e.get("name") for e in env}
    env.extend({"name": k, "value": str(v)} for k, v in naming.LAUNCHER_DEFAULTS.items()
               if k not in given)  # fmt: skip
    placement.apply(spec)
    gang.place(job_spec, spec, worker=False)
    pod = pod_of(
        naming.launcher_name(job_spec.name),
        job_spec,
        owner,
        job_spec.launcher.template,
        naming.launcher_labels(job_spec.name),
        spec,
    )
    pod["metadata"].setdefault("annotations", {})[naming.ANN_RUN] = str(run)
    return pod


NUM_PROC = ("-np", "--num-proc")


def start_with(pod: dict[str, Any], slots: int) -> None:
    """horovodrun's -np lowered to the slots the run starts with (never below its --min-np):
    elastic horovodrun waits for -np slots before it starts, up to its --elastic-timeout
    (600 s), then fails; a run that starts smaller (a resume after a ScaleIn, a partial
    admission) would wait for workers that never come. Never raised: Horovod starts on every
    slot listed anyway. Only horovodrun's own options (before the training command: a python
    or a .py); a command inside a shell's string is the user's own."""
    first = pod["spec"]["containers"][0]
    command, args = list(first.get("command") or []), list(first.get("args") or [])
    argv = command + args
    if not argv or os.path.basename(str(argv[0])) != "horovodrun" or slots < 1:
        return
    ours = next((i for i, a in enumerate(argv) if "python" in a or a.endswith(".py")), len(argv))
    opts = [part for a in argv[1:ours] for part in str(a).split("=", 1)]
    values = dict(zip(opts, [*opts[1:], ""], strict=True))
    least = int(values["--min-np"]) if values.get("--min-np", "").isdigit() else 1
    for i, a in enumerate(opts[:-1]):
        if a in NUM_PROC and opts[i + 1].isdigit() and int(opts[i + 1]) > slots:
            opts[i + 1] = str(max(slots, least))
    argv = [argv[0], *opts, *argv[ours:]]
    cut = min(len(command), len(argv))
    first["command"] = argv[:cut]
    if args or len(argv) > cut:
        first["args"] = argv[cut:]


def launcher_service_account(job_spec: JobSpec, template: dict[str, Any]) -> str:
    """The account the launcher runs as: the template's own, else one the operator creates."""
    name = (template.get("spec") or {}).get("serviceAccountName")
    return str(name) if name else naming.launcher_sa_name(job_spec.name)


def worker_service(job_spec: JobSpec, owner: Owner, index: int) -> dict[str, Any]:
    name = naming.worker_name(job_spec.name, index)
    labels = naming.worker_labels(job_spec.name, index)
    ports = {f"port-{p}": p for p in naming.SERVICE_PORTS}
    return headless_service(job_spec, owner, name, labels, ports)


def headless_service(
    job_spec: JobSpec, owner: Owner, name: str, labels: dict[str, str], ports: dict[str, int]
) -> dict[str, Any]:
    """A name in cluster DNS for the one pod `labels` select, from before it is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, job_spec.namespace, owner, labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels,
            "ports": [
                {"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports.items()
            ],
        },
    }
