"""Every bounded or enumerated field of the three kinds, once: its path, bounds, default and
description. crds.py builds the schema from these, models.py parses with them, so the schema
and the operator's own checks (for objects written before the schema) never disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_WORKERS = 10_000  # the schema's ceiling on workers per job
DEFAULT_MAX_WORKERS = 1_000  # this operator's default limit (ETOPERATOR_MAX_WORKERS)
MAX_SLOTS = 1_024  # slots (processes) per worker
# A scale waits at most a day: longer overflows timers (a ScaleOut waiting on capacity should
# fail and be retried, not hold the job's scaler queue for weeks).
MAX_TIMEOUT = 86_400
DEFAULT_TIMEOUT = 60
DEFAULT_BACKOFF_LIMIT = 6

WORKER_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
JOB_RESTART_POLICIES = ("Never", "OnFailure")
CLEAN_POD_POLICIES = ("All", "Running", "None")
ATTACH_MODES = ("ssh",)
RUNTIMES = ("Horovod", "Torchrun")
DEFAULT_RDZV_PORT = 29400  # torchrun's own default

Schema = dict[str, Any]


class InvalidSpec(ValueError):
    """A spec the operator cannot run; the message is shown to the user as-is."""


@dataclass(frozen=True)
class Int:
    path: str
    desc: str
    minimum: int | None = None
    maximum: int | None = None
    default: int | None = None

    def schema(self) -> Schema:
        s: Schema = {"type": "integer", "format": "int32", "description": self.desc}
        for key, value in (("minimum", self.minimum), ("maximum", self.maximum)):
            if value is not None:
                s[key] = value
        if self.default is not None:
            s["default"] = self.default
        return s

    def parse(self, value: Any) -> int | None:
        if value is None:
            return self.default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSpec(f"{self.path} must be an integer, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InvalidSpec(f"{self.path} must be at least {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidSpec(f"{self.path} must be at most {self.maximum}, got {value}")
        return value


@dataclass(frozen=True)
class Enum:
    path: str
    desc: str
    values: tuple[str, ...]
    default: str

    def schema(self, with_default: bool = True) -> Schema:
        s: Schema = {"type": "string", "enum": list(self.values), "description": self.desc}
        if with_default:
            s["default"] = self.default
        return s

    def parse(self, value: Any) -> str:
        if value is None:
            return self.default
        if value not in self.values:
            raise InvalidSpec(f"{self.path} must be one of {', '.join(self.values)}, got {value!r}")
        return str(value)


W = "spec.etReplicaSpecs.worker"
L = "spec.etReplicaSpecs.launcher"
REPLICAS = Int(f"{W}.replicas", "initial and desired worker count", 1, MAX_WORKERS, 1)
MIN_REPLICAS = Int(
    f"{W}.minReplicas", "fewest workers scaling may leave (default 1)", 1, MAX_WORKERS
)
MAX_REPLICAS = Int(
    f"{W}.maxReplicas", "most workers scaling may reach (default: the operator's limit)", 1,
    MAX_WORKERS,
)  # fmt: skip
WORKER_RESTART = Enum(
    f"{W}.restartPolicy", "replace a failed worker? (default Never)", WORKER_RESTART_POLICIES,
    "Never",
)  # fmt: skip
LAUNCHER_REPLICAS = Int(f"{L}.replicas", "always 1", 1, 1, 1)
LAUNCHER_RESTART = Enum(
    f"{L}.restartPolicy",
    "Always or OnFailure recreate a lost launcher (default Never: the job fails)",
    WORKER_RESTART_POLICIES,
    "Never",
)
SLOTS = Int("spec.slotsPerWorker", "slots per host (default: GPU limit, else 1)", 1, MAX_SLOTS)
CLEAN_POD = Enum("spec.cleanPodPolicy", "pods to delete at end", CLEAN_POD_POLICIES, "Running")
JOB_RESTART = Enum("spec.restartPolicy", "restart a failed job?", JOB_RESTART_POLICIES, "Never")
MIN_AVAILABLE = Int(
    "spec.schedulingPolicy.minAvailable",
    "workers placed all or nothing before any runs (default: minReplicas)",
    1,
    MAX_WORKERS,
)
BACKOFF = Int("spec.backoffLimit", "most whole-job restarts", 0, None, DEFAULT_BACKOFF_LIMIT)
ATTACH = Enum("spec.launcherAttachMode", "how the launcher reaches workers", ATTACH_MODES, "ssh")

RUNTIME = Enum(
    "spec.runtime",
    "Horovod: horovodrun in the launcher reaches the workers over SSH; Torchrun: each worker "
    "runs torchrun's elastic agent, meeting at a rendezvous the launcher holds",
    RUNTIMES,
    "Horovod",
)
E = "spec.elasticPolicy"
NPROC = Int(f"{E}.nProcPerNode", "training processes per worker (torchrun's --nproc-per-node)",
            1, MAX_SLOTS)  # fmt: skip
MAX_RESTARTS = Int(
    f"{E}.maxRestarts",
    "failures each agent survives (torchrun's --max-restarts); planned changes count none",
    0, 1_000, 3,
)  # fmt: skip
RDZV_PORT = Int(f"{E}.rdzvPort", "the rendezvous' port on the launcher", 1024, 65535,
                DEFAULT_RDZV_PORT)  # fmt: skip

TIMEOUT = Int("spec.timeout", "seconds the scale may take", 1, MAX_TIMEOUT, DEFAULT_TIMEOUT)
SCALER_BACKOFF = Int("spec.backoffLimit", "accepted for compatibility; unused", 0)
ADD_COUNT = Int("spec.toAdd.count", "workers to add", 1, MAX_WORKERS)
DELETE_COUNT = Int(
    "spec.toDelete.count", "workers to remove, highest indices first", 1, MAX_WORKERS
)
