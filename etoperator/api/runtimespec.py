"""What a job asks of its runtime beyond Horovod's: a Torchrun job's elasticPolicy (and the
worker settings that would fight the operator's), and the shared volume any job may ask for.
Parsed from the worker's template; models.py puts them in the JobSpec."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from etoperator import naming
from etoperator.api import fields as f
from etoperator.api.fields import InvalidSpec


@dataclass(frozen=True)
class ElasticPolicy:
    """spec.elasticPolicy of a Torchrun job (PyTorchJob's names): what each worker's
    torchrun is given beyond what the operator fills in."""

    nproc_per_node: int
    max_restarts: int
    rdzv_port: int


@dataclass(frozen=True)
class SharedVolume:
    """spec.sharedVolume: one ReadWriteMany claim the operator makes for the job (its
    checkpoints), mounted in every worker; deleted with the job, kept across its runs."""

    mount_path: str
    storage_class: str | None
    storage: str


# What the operator gives each worker's torchrun (its flags read PET_<FLAG> from the
# environment): the user's own would break the rendezvous.
OWNED_TORCHRUN_ENV = (
    "PET_NNODES", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF",
    "PET_LOCAL_ADDR", "PET_MAX_RESTARTS", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
)  # fmt: skip
OWNED_TORCHRUN_FLAGS = ("--nnodes", "--rdzv", "--local-addr", "--local_addr", "--node-rank",
                        "--node_rank", "--master", "--standalone", "--max-restarts")  # fmt: skip


def elastic(policy: Any, template: dict[str, Any]) -> ElasticPolicy:
    """spec.elasticPolicy, defaulted; the worker's own torchrun settings that would fight the
    operator's refused (the operator fills them in)."""
    policy = policy if policy is not None else {}
    if not isinstance(policy, dict):
        raise InvalidSpec("spec.elasticPolicy must be an object")
    container = template["spec"]["containers"][0]
    if not container.get("command"):
        raise InvalidSpec(
            f"{f.W}.template: a Torchrun worker's first container needs a command "
            "(torchrun and your script, e.g. [torchrun, /train.py])"
        )
    env = {str(e.get("name")) for e in container.get("env") or [] if isinstance(e, dict)}
    taken = sorted(env & set(OWNED_TORCHRUN_ENV))
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    flags = sorted({a.split("=")[0] for a in argv if a.startswith(OWNED_TORCHRUN_FLAGS)})
    if taken or flags:
        raise InvalidSpec(
            f"{f.W}.template sets {', '.join(taken + flags)}: the operator sets the node "
            "counts, the rendezvous and the restarts of a Torchrun job (spec.elasticPolicy, "
            "minReplicas and maxReplicas); remove them"
        )
    return ElasticPolicy(
        nproc_per_node=f.NPROC.parse(policy.get("nProcPerNode")) or 1,
        max_restarts=f.MAX_RESTARTS.parse(policy.get("maxRestarts")) or 0,
        rdzv_port=f.RDZV_PORT.parse(policy.get("rdzvPort")) or f.DEFAULT_RDZV_PORT,
    )


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


def shared(volume: Any, template: dict[str, Any]) -> SharedVolume | None:
    if volume is None:
        return None
    if not isinstance(volume, dict):
        raise InvalidSpec("spec.sharedVolume must be an object")
    path = volume.get("mountPath", "/checkpoints")
    if not isinstance(path, str) or not posixpath.isabs(path) or ".." in path.split("/"):
        raise InvalidSpec(f"spec.sharedVolume.mountPath must be an absolute path, got {path!r}")
    sc = volume.get("storageClassName")
    if sc is not None and not (isinstance(sc, str) and naming.is_dns1123_subdomain(sc)):
        raise InvalidSpec(f"spec.sharedVolume.storageClassName must be a valid name, got {sc!r}")
    size = str(volume.get("storage", "1Gi"))
    if not QUANTITY.match(size):
        raise InvalidSpec(f"spec.sharedVolume.storage must be a quantity like 10Gi, got {size!r}")
    pod = template["spec"]
    mounts = pod["containers"][0].get("volumeMounts") or []
    if any(m.get("mountPath") == path for m in mounts):
        raise InvalidSpec(
            f"spec.sharedVolume.mountPath {path} is already a mount of the worker's container"
        )
    return SharedVolume(mount_path=path, storage_class=sc, storage=size)
