"""Every name, label and selector the operator uses, and the checks that keep them valid."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

GROUP = "kai.alibabacloud.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

JOB_KIND = "TrainingJob"
SCALEOUT_KIND = "ScaleOut"
SCALEIN_KIND = "ScaleIn"
JOB_PLURAL = "trainingjobs"
SCALEOUT_PLURAL = "scaleouts"
SCALEIN_PLURAL = "scaleins"

# Labels every child carries (wire-compatible with the Go operator).
LABEL_GROUP = "group-name"
LABEL_JOB = "training-job-name"
LABEL_ROLE = "training-job-role"
LABEL_INDEX = "replica-index"
ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"

# Annotations read from a TrainingJob.
ANN_SUSPENDED = "job-supervisor.kube-ai.io/job-suspended"
ANN_SSH_SECRET = "arena.kubeflow.org/ssh-secret"
# Kueue: a job with this label waits for its queue's admission; its Workload carries the job's
# uid under KUEUE_JOB_UID. The priority label names a WorkloadPriorityClass.
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
WORKLOAD_KIND = "Workload"
# Gang scheduling: Kubernetes' own Workload API.
SCHEDULING_GROUP = "scheduling.k8s.io"
SCHEDULING_VERSION = "v1alpha2"
POD_GROUP_KIND = "PodGroup"
GANG_WORKLOAD = "Workload.scheduling.k8s.io"  # as the API client files it (beside Kueue's)
GANG_TEMPLATE = "workers"
# Our own prefix, for kopf's bookkeeping and for marks on children.
ANN_PREFIX = "etoperator.kai.alibabacloud.com"
# The run (restartCount) a launcher was created for.
ANN_RUN = f"{ANN_PREFIX}/run"
# "true" on a Torchrun job: torchrun as it is (its own timeouts, no leave hook, a rendezvous
# that only stores): what the operator's help is measured against (bench/torchrun.py).
ANN_TORCHRUN_PLAIN = f"{ANN_PREFIX}/torchrun-plain"
# Set on scalers the operator creates for `kubectl scale`.
ANN_SCALE_GENERATION = f"{ANN_PREFIX}/replicas-generation"

# Volumes the operator adds to pods, and where the first container gets them: reserved, so a
# template can neither receive the private key elsewhere nor have its own volume replaced.
SSH_VOLUME = "etoperator-ssh"
CONFIG_VOLUME = "etoperator-config"
CONFIG_MOUNT = "/etc/edl"
SSH_MOUNT = "/root/.ssh"
HOSTFILE_KEY = "hostfile"
DISCOVER_KEY = "discover_hosts.sh"
DEEPSPEED_KEY = "deepspeed-hostfile"
SHARED_VOLUME = "etoperator-shared"  # spec.sharedVolume, in every worker
CHECKPOINT_ENV = "CHECKPOINT_DIR"  # where it is mounted, as the workers' scripts read it
# The save handshake's files in that directory (docs/behaviour.md, "A save before every stop"):
# the launcher's preStop touches the request; a script that honours it (it made the marker at
# its start) saves at its next step, then writes the report ("step=<n> t=<unix time>").
SAVE_REQUEST = ".etoperator-save-request"
SAVE_REPORT = ".etoperator-saved"
SAVE_MARKER = ".etoperator-saves"
# A torchrun launcher's own pod and namespace (rendezvous.py asks if its pod is being deleted)
LAUNCHER_POD_ENV, LAUNCHER_NS_ENV = "ETOPERATOR_POD", "ETOPERATOR_NAMESPACE"
SAVE_WAIT = 20  # seconds the launcher's preStop waits for the report (within its grace period)
RENDEZVOUS_KEY = "rendezvous.py"  # a Torchrun job's rendezvous host
LEAVE_KEY = "leave.py"  # a Torchrun job's workers' leave (their preStop), beside it
AGENT_KEY = "torchagent.py"  # a Torchrun job's workers' agent (torchrun, forked workers)

SSH_PORT = 22
SERVICE_PORTS = (22, 9009)

DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS1123_LABEL = re.compile(DNS1123_LABEL_PATTERN)
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
# The longest index suffix we allow a job to reach; bounds the job-name length so that
# `<job>-worker-<i>` always fits a 63-character DNS label (services need one).
MAX_INDEX_DIGITS = 6
WORKER_INFIX = "-worker-"
MAX_JOB_NAME = 63 - len(WORKER_INFIX) - MAX_INDEX_DIGITS


_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def is_dns1035_label(name: str) -> bool:
    """What a Service name must be: a DNS-1123 label that starts with a letter."""
    return len(name) <= 63 and bool(_DNS1035_LABEL.match(name))


def is_dns1123_label(name: str) -> bool:
    return len(name) <= 63 and bool(_DNS1123_LABEL.match(name))


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS1123_SUBDOMAIN.match(name))


def job_name_problem(name: str) -> str | None:
    """Why `name` cannot name a job's children, or None when it can."""
    if not is_dns1123_label(name):
        return f"job name {name!r} is not a DNS-1123 label (lower-case alphanumerics and '-')"
    if not is_dns1035_label(name):
        return (
            f"job name {name!r} must start with a letter: its workers' Services are named "
            f"'{name}{WORKER_INFIX}<index>', and a Service name is a DNS-1035 label"
        )
    if len(name) > MAX_JOB_NAME:
        return (
            f"job name {name!r} is {len(name)} characters; at most {MAX_JOB_NAME} leave room "
            f"for '{WORKER_INFIX}<index>' in a 63-character service name"
        )
    return None


def worker_name(job: str, index: int) -> str:
    return f"{job}{WORKER_INFIX}{index}"


def worker_index(job: str, pod_name: str) -> int | None:
    """The index in `<job>-worker-<i>`, or None when the name is not one of this job's workers."""
    prefix = f"{job}{WORKER_INFIX}"
    if not pod_name.startswith(prefix):
        return None
    rest = pod_name[len(prefix) :]
    if not rest.isdigit() or (len(rest) > 1 and rest[0] == "0"):
        return None
    return int(rest)


def launcher_name(job: str) -> str:
    return f"{job}-launcher"


def replicas_scaler_name(job: str, generation: int) -> str:
    """The scaler the operator makes for `kubectl scale` at a generation of the job."""
    return f"{job}-replicas-{generation}"


def config_map_name(job: str) -> str:
    return f"{job}-config"


def secret_name(job: str) -> str:
    return job


def workload_name(job: str, uid: str) -> str:
    """The job's Kueue Workload: `trainingjob-<job>-<5 hex of the uid>`, as Kueue's own
    integrations name theirs (another job of the same name later gets another Workload)."""
    digest = hashlib.sha256(uid.encode()).hexdigest()[:5]
    return f"trainingjob-{job}-{digest}"


def pod_group_name(job: str) -> str:
    """The workers' PodGroup (gang scheduling); the Workload that holds its template is named
    as the job."""
    return f"{job}-workers"


def launcher_sa_name(job: str) -> str:
    return f"{job}-launcher"


def selected_job(scaler: Mapping[str, Any]) -> str:
    """The job a scaler's spec.selector.name names, or "" whatever else it holds: scalers
    written without the schema may hold anything (parsing says what is wrong with them)."""
    spec = scaler.get("spec")
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    name = selector.get("name") if isinstance(selector, Mapping) else None
    return name if isinstance(name, str) else ""


def scaler_ref(kind: str, namespace: str, name: str) -> str:
    """The job's `status.currentScaler` value, as the Go operator wrote it."""
    return f"{kind}:{namespace}/{name}"


def parse_scaler_ref(ref: str) -> tuple[str, str, str] | None:
    kind, sep, rest = ref.partition(":")
    ns, sep2, name = rest.partition("/")
    if not sep or not sep2 or kind not in (SCALEOUT_KIND, SCALEIN_KIND):
        return None
    return kind, ns, name


def job_labels(job: str) -> dict[str, str]:
    return {LABEL_GROUP: GROUP, LABEL_JOB: job}


def worker_labels(job: str, index: int) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: ROLE_WORKER, LABEL_INDEX: str(index)}


def launcher_labels(job: str) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: ROLE_LAUNCHER}


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def worker_selector(job: str) -> str:
    return selector({**job_labels(job), LABEL_ROLE: ROLE_WORKER})


# Horovod's Gloo rendezvous timeout, unless the launcher sets its own (its template's env, or
# horovodrun's --gloo-timeout-seconds; horovodrun hands it to every worker). At a new size the
# workers already training wait this long in the rendezvous for a joining worker to start its
# process; Horovod's own 30 s is less than a first import of torch on a busy node or a CUDA init
# may take, and running out of it aborts every rank: the job fails. Operations keep their short
# timeout (HOROVOD_GLOO_OP_TIMEOUT_SECONDS in the project's Horovod build).
RENDEZVOUS_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
RENDEZVOUS_TIMEOUT = 180
# horovodrun's time to start its task servers on the first hosts (over ssh, each a Python with
# Horovod imported) and find their common network: 30 s of its own ran out on busy nodes and
# failed the job at its start. The template's env or --start-timeout still decide.
START_TIMEOUT_ENV = "HOROVOD_START_TIMEOUT"
START_TIMEOUT = 120
LAUNCHER_DEFAULTS = {RENDEZVOUS_TIMEOUT_ENV: RENDEZVOUS_TIMEOUT, START_TIMEOUT_ENV: START_TIMEOUT}


def shared_claim_name(job: str) -> str:
    """The job's spec.sharedVolume claim."""
    return f"{job}-shared"
