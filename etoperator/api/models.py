"""Parsed, defaulted views of the three kinds, and the checks only the operator can make.

The CRD schema (api/crds.py) rejects most bad input at the API server; these parsers repeat
the essential checks so that a cluster without schema enforcement (or an object written before
the CRD was updated) still gets a clear Failed condition instead of a crash.
"""

from __future__ import annotations

import copy
import itertools
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from etoperator import naming
from etoperator.api import claims
from etoperator.api import fields as f
from etoperator.api import runtimespec as rs
from etoperator.api.fields import (  # re-exported: the names the rest of the code uses
    DEFAULT_MAX_WORKERS,
    MAX_SLOTS,
    InvalidSpec,
)

RESERVED_VOLUMES = (naming.SSH_VOLUME, naming.CONFIG_VOLUME)
RESERVED_MOUNTS = (naming.SSH_MOUNT, naming.CONFIG_MOUNT)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _dict(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidSpec(f"{what} must be an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidSpec(f"{what} must be a list")
    return value


def _str(value: Any, what: str, required: bool = False) -> None:
    if (value is None and required) or (value is not None and not isinstance(value, str)):
        raise InvalidSpec(f"{what} must be a string")


def _strings(value: Any, what: str) -> None:
    """A map of strings (labels, annotations) or a list of strings (command, args)."""
    items = _dict(value, what).values() if not isinstance(value, list) else value
    if any(not isinstance(v, str) for v in items):
        raise InvalidSpec(f"{what} must hold strings only")


def _objects(value: Any, what: str, required: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for i, item in enumerate(_list(value, what)):
        if not isinstance(item, dict):
            raise InvalidSpec(f"{what}[{i}] must be an object")
        for key in required:
            _str(item.get(key), f"{what}[{i}].{key}", required=True)
        out.append(item)
    return out


def _container(c: dict[str, Any], what: str, first: bool) -> None:
    _str(c.get("image"), f"{what}.image")
    for key in ("command", "args"):
        if key in c:
            _strings(_list(c[key], f"{what}.{key}"), f"{what}.{key}")
    for i, e in enumerate(_objects(c.get("env"), f"{what}.env", ("name",))):
        _str(e.get("value"), f"{what}.env[{i}].value")
    if "resources" in c:
        if not isinstance(c["resources"], dict):  # null too: the builders read into it
            raise InvalidSpec(f"{what}.resources must be an object")
        resources = c["resources"]
        for key in ("limits", "requests"):
            _dict(resources.get(key), f"{what}.resources.{key}")
    for i, m in enumerate(_objects(c.get("volumeMounts"), f"{what}.volumeMounts", ("name",))):
        where = f"{what}.volumeMounts[{i}]"
        _str(m.get("mountPath"), f"{where}.mountPath", required=True)
        if m["name"] in RESERVED_VOLUMES:
            raise InvalidSpec(f"{where}.name {m['name']!r} is the operator's volume; pick another")
        if first and posixpath.normpath(m["mountPath"]) in RESERVED_MOUNTS:
            raise InvalidSpec(
                f"{where}.mountPath {m['mountPath']} is where the operator mounts its own volume"
            )


def _template(value: Any, what: str) -> dict[str, Any]:
    """A pod template the builders can use: every field they read has the right shape, and
    no name or path the operator reserves is taken (the message names the field)."""
    tpl = _dict(value, what)
    meta = _dict(tpl.get("metadata"), f"{what}.metadata")
    for key in ("labels", "annotations"):
        _strings(meta.get(key), f"{what}.metadata.{key}")
    spec = _dict(tpl.get("spec"), f"{what}.spec")
    containers = _objects(spec.get("containers"), f"{what}.spec.containers", ("name",))
    if not containers:
        raise InvalidSpec(f"{what}.spec.containers must list at least one container")
    for i, c in enumerate(containers):
        _container(c, f"{what}.spec.containers[{i}]", first=i == 0)
    for i, c in enumerate(
        _objects(spec.get("initContainers"), f"{what}.spec.initContainers", ("name",))
    ):
        _container(c, f"{what}.spec.initContainers[{i}]", first=False)
    for i, v in enumerate(_objects(spec.get("volumes"), f"{what}.spec.volumes", ("name",))):
        if v["name"] in RESERVED_VOLUMES:
            raise InvalidSpec(
                f"{what}.spec.volumes[{i}].name {v['name']!r} is reserved for the operator; "
                "pick another name"
            )
    return copy.deepcopy(tpl)


def _gpu_limit(template: dict[str, Any], what: str) -> int | None:
    """Slots from the first container's nvidia.com/gpu limit: a whole number of GPUs."""
    limits = (template["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    raw = limits.get("nvidia.com/gpu")
    if raw is None:
        return None
    text = str(raw)
    if not text.isdigit() or not 0 <= int(text) <= MAX_SLOTS:
        raise InvalidSpec(
            f"{what}.spec.containers[0].resources.limits['nvidia.com/gpu'] must be a whole "
            f"number of GPUs from 0 to {MAX_SLOTS}, got {text!r}"
        )
    return int(text) or None


@dataclass(frozen=True)
class WorkerSpec:
    template: dict[str, Any]
    replicas: int
    min_replicas: int
    max_replicas: int | None
    restart_policy: str
    limit: int = DEFAULT_MAX_WORKERS  # this operator's most workers per job


@dataclass(frozen=True)
class LauncherSpec:
    template: dict[str, Any]
    restart_policy: str
    rendezvous_timeout: int = naming.RENDEZVOUS_TIMEOUT  # Horovod's, in seconds (naming.py)


@dataclass(frozen=True)
class GangPolicy:
    """spec.schedulingPolicy: the workers placed all or nothing, at least `min_available` of
    them (Kubernetes' Workload API), with the pods' priority class and scheduler."""

    min_available: int
    priority_class: str | None = None
    scheduler_name: str | None = None


@dataclass(frozen=True)
class JobSpec:
    name: str
    namespace: str
    uid: str
    launcher: LauncherSpec
    worker: WorkerSpec
    slots_per_worker: int
    clean_pod_policy: str
    restart_policy: str
    backoff_limit: int
    suspended: bool  # spec.suspend, or the Go operator's annotation
    ssh_secret: str | None
    annotations: dict[str, str] = field(default_factory=dict)
    queue: str | None = None  # the Kueue LocalQueue that admits it (kueue.x-k8s.io/queue-name)
    priority_class: str | None = None  # its WorkloadPriorityClass in that queue
    gang: GangPolicy | None = None  # spec.schedulingPolicy: gang scheduling of the workers
    runtime: str = "Horovod"  # spec.runtime: Horovod or Torchrun
    elastic: rs.ElasticPolicy | None = None  # spec.elasticPolicy (a Torchrun job's, defaulted)
    shared: rs.SharedVolume | None = None  # spec.sharedVolume

    @property
    def torchrun(self) -> bool:
        return self.runtime == "Torchrun"


def parse_job(body: dict[str, Any], max_workers: int = DEFAULT_MAX_WORKERS) -> JobSpec:
    """A defaulted JobSpec from a TrainingJob body; InvalidSpec says what is wrong."""
    meta = body.get("metadata", {})
    name = meta.get("name", "")
    problem = naming.job_name_problem(name)
    if problem:
        raise InvalidSpec(problem)
    spec = _dict(body.get("spec"), "spec")
    runtime = f.RUNTIME.parse(spec.get("runtime"))
    worker, launcher, elastic = _roles(spec, runtime, max_workers)
    slots = f.SLOTS.parse(spec.get("slotsPerWorker"))
    gpus = _gpu_limit(worker.template, f"{f.W}.template")
    f.ATTACH.parse(spec.get("launcherAttachMode"))
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    ssh_secret = annotations.get(naming.ANN_SSH_SECRET) or None
    if ssh_secret is not None and not naming.is_dns1123_subdomain(ssh_secret):
        raise InvalidSpec(f"annotation {naming.ANN_SSH_SECRET} names no valid Secret")
    queue, priority = _kueue_labels(meta.get("labels") or {})
    return JobSpec(
        name=name,
        namespace=meta.get("namespace", "default"),
        uid=meta.get("uid", ""),
        launcher=launcher,
        worker=worker,
        slots_per_worker=slots if slots is not None else gpus or 1,
        clean_pod_policy=f.CLEAN_POD.parse(spec.get("cleanPodPolicy")),
        restart_policy=f.JOB_RESTART.parse(spec.get("restartPolicy")),
        backoff_limit=f.BACKOFF.parse(spec.get("backoffLimit")) or 0,
        suspended=_suspend(spec.get("suspend"))
        or annotations.get(naming.ANN_SUSPENDED, "").lower() == "true",
        ssh_secret=ssh_secret,
        annotations=annotations,
        queue=queue,
        priority_class=priority,
        gang=_gang(spec.get("schedulingPolicy"), worker),
        runtime=runtime,
        elastic=elastic,
        shared=rs.shared(spec.get("sharedVolume"), worker.template),
    )


def _roles(
    spec: dict[str, Any], runtime: str, max_workers: int
) -> tuple[WorkerSpec, LauncherSpec, rs.ElasticPolicy | None]:
    """The worker, the launcher (a Torchrun job's may be left out) and the elastic policy."""
    replica_specs = _dict(spec.get("etReplicaSpecs"), "spec.etReplicaSpecs")
    torchrun = runtime == "Torchrun"
    if "worker" not in replica_specs or not (torchrun or "launcher" in replica_specs):
        raise InvalidSpec("spec.etReplicaSpecs needs both launcher and worker")
    worker = _worker(_dict(replica_specs["worker"], f.W), max_workers)
    if not torchrun:
        if spec.get("elasticPolicy") is not None:
            raise InvalidSpec("spec.elasticPolicy is for runtime Torchrun; this job runs Horovod")
        return worker, _launcher(_dict(replica_specs["launcher"], f.L)), None
    launcher = _rendezvous_host(replica_specs.get("launcher"), worker)
    return worker, launcher, rs.elastic(spec.get("elasticPolicy"), worker.template)


def _rendezvous_host(launcher: Any, worker: WorkerSpec) -> LauncherSpec:
    """A Torchrun job's launcher holds the rendezvous: its template if given (its image
    needs torch), else one made of the worker's image alone (no GPU, no volumes)."""
    if launcher is not None:
        given = _launcher(_dict(launcher, f.L))
        return LauncherSpec(template=given.template, restart_policy=given.restart_policy)
    first = worker.template["spec"]["containers"][0]
    container = {"name": "rendezvous", "image": first.get("image")}
    if first.get("imagePullPolicy"):
        container["imagePullPolicy"] = first["imagePullPolicy"]
    spec: dict[str, Any] = {"containers": [container]}
    for key in ("imagePullSecrets", "nodeSelector", "tolerations"):
        if worker.template["spec"].get(key):
            spec[key] = copy.deepcopy(worker.template["spec"][key])
    return LauncherSpec(template={"spec": spec}, restart_policy=f.LAUNCHER_RESTART.default)


def _gang(policy: Any, worker: WorkerSpec) -> GangPolicy | None:
    if policy is None:
        return None
    policy = _dict(policy, "spec.schedulingPolicy")
    least = f.MIN_AVAILABLE.parse(policy.get("minAvailable"))
    least = worker.min_replicas if least is None else least
    if least > worker.replicas:
        raise InvalidSpec(
            f"spec.schedulingPolicy.minAvailable ({least}) is above "
            f"{f.W}.replicas ({worker.replicas}): the gang could never start"
        )
    names = []
    for key in ("priorityClass", "schedulerName"):
        value = policy.get(key)
        if value is not None and not (
            isinstance(value, str) and naming.is_dns1123_subdomain(value)
        ):
            raise InvalidSpec(f"spec.schedulingPolicy.{key} must be a valid name, got {value!r}")
        names.append(value)
    return GangPolicy(least, names[0], names[1])


def _suspend(value: Any) -> bool:
    if value is not None and not isinstance(value, bool):
        raise InvalidSpec(f"spec.suspend must be true or false, got {value!r}")
    return bool(value)


def _kueue_labels(labels: dict[str, Any]) -> tuple[str | None, str | None]:
    """The LocalQueue and WorkloadPriorityClass named by Kueue's labels (each a valid name)."""
    out: list[str | None] = []
    for key in (naming.LABEL_QUEUE, naming.LABEL_KUEUE_PRIORITY):
        value = labels.get(key)
        if value is not None and not naming.is_dns1123_subdomain(str(value)):
            raise InvalidSpec(f"label {key} must name a {key.split('/')[1]}, got {value!r}")
        out.append(str(value) if value else None)
    return out[0], out[1]


def _worker(worker: dict[str, Any], max_workers: int) -> WorkerSpec:
    replicas = f.REPLICAS.parse(worker.get("replicas")) or 1
    min_r = f.MIN_REPLICAS.parse(worker.get("minReplicas")) or 1
    max_r = f.MAX_REPLICAS.parse(worker.get("maxReplicas"))
    for field_name, value in (("replicas", replicas), ("minReplicas", min_r)):
        if value > max_workers:
            raise InvalidSpec(
                f"{f.W}.{field_name} ({value}) is above this operator's limit of {max_workers} "
                "workers per job (ETOPERATOR_MAX_WORKERS)"
            )
    if min_r > replicas:
        raise InvalidSpec(f"{f.W}.minReplicas ({min_r}) is above replicas ({replicas})")
    if max_r is not None and replicas > max_r:
        raise InvalidSpec(f"{f.W}.replicas ({replicas}) is above maxReplicas ({max_r})")
    return WorkerSpec(
        template=_template(worker.get("template"), f"{f.W}.template"),
        replicas=replicas,
        min_replicas=min_r,
        max_replicas=max_r,
        limit=max_workers,
        restart_policy=f.WORKER_RESTART.parse(worker.get("restartPolicy")),
    )


def _run_as_user(spec: dict[str, Any]) -> Any:
    """The uid the first container asks to run as (its own securityContext, else the pod's)."""
    for ctx in (spec["containers"][0].get("securityContext"), spec.get("securityContext")):
        if isinstance(ctx, dict) and ctx.get("runAsUser") is not None:
            return ctx["runAsUser"]
    return None


def _launcher(launcher: dict[str, Any]) -> LauncherSpec:
    f.LAUNCHER_REPLICAS.parse(launcher.get("replicas"))
    template = _template(launcher.get("template"), f"{f.L}.template")
    uid = _run_as_user(template["spec"])
    if uid not in (None, 0):
        # OpenSSH needs the user in the image's passwd and its key under that user's home; the
        # job's key is at /root/.ssh, which only root can reach. Said now, not after a hang.
        raise InvalidSpec(
            f"{f.L}.template: the launcher's first container runs as uid {uid}, but horovodrun "
            f"reaches the workers with ssh and the job's key at {naming.SSH_MOUNT}, which only "
            "root can read; run the launcher as root (runAsUser 0 or unset)"
        )
    return LauncherSpec(
        template=template,
        restart_policy=f.LAUNCHER_RESTART.parse(launcher.get("restartPolicy")),
        rendezvous_timeout=_rendezvous_timeout(template["spec"]),
    )


def _rendezvous_timeout(pod_spec: dict[str, Any]) -> int:
    """How long Horovod's ranks wait for each other in a rendezvous: horovodrun's flag, else
    the launcher's env, else the operator's default (only a plain number counts)."""
    container = (pod_spec.get("containers") or [{}])[0]
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    given = [b for a, b in itertools.pairwise(argv) if a == "--gloo-timeout-seconds"]
    given += [a.split("=", 1)[1] for a in argv if a.startswith("--gloo-timeout-seconds=")]
    given += [
        str(e.get("value"))
        for e in container.get("env") or []
        if e.get("name") == naming.RENDEZVOUS_TIMEOUT_ENV
    ]
    numbers = [int(v) for v in given if v.isdigit()]
    return numbers[0] if numbers else naming.RENDEZVOUS_TIMEOUT


def template_secrets(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, name) of every Secret the launcher and worker templates name."""
    return claims.template_secrets(
        {"launcher": spec.launcher.template, "worker": spec.worker.template}
    )
