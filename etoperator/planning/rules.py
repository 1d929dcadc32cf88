"""Rules a plan follows, as small pure functions: replacement, victims, limits, scripts."""

from __future__ import annotations

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.api.scalers import ScalerSpec
from etoperator.planning.views import PodView, ScalerView


def workers(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


def by_index(job: str, names: list[str]) -> list[str]:
    return sorted(set(names), key=lambda n: (naming.worker_index(job, n) or 0, n))


def replaces(policy: str, pod: PodView | None) -> bool:
    """Does the worker restartPolicy ask for a replacement of this lost worker?"""
    if policy == "Always":
        return True
    if policy == "Never":
        return False
    code = pod.exit_code if pod is not None and not pod.deleting and not pod.leaving else None
    if policy == "OnFailure":
        return code != 0
    # ExitCode: 1-127 are the program's own verdict (permanent); signals and loss are retryable.
    return code is None or code >= 128


def victims_by_count(job: str, members: list[str], count: int) -> list[str]:
    """Highest indices first."""
    return by_index(job, members)[::-1][:count]


def check_scale_in(
    job_spec: JobSpec, members: list[str], hosts: list[str], spec: ScalerSpec, beyond: int = 0
) -> tuple[list[str], str | None]:
    """Victims of a ScaleIn, or the reason it cannot run (then nothing is deleted). `beyond`:
    a queued job's workers asked for and not running; a count takes them first."""
    if spec.pod_names is not None:
        unknown = [n for n in spec.pod_names if n not in members]
        if unknown:
            return [], (
                f"not current workers of job {job_spec.name}: {', '.join(unknown)}; nothing deleted"
            )
        victims, removed = list(spec.pod_names), len(spec.pod_names)
    else:
        assert spec.count is not None
        victims = victims_by_count(job_spec.name, members, spec.count - min(spec.count, beyond))
        removed = spec.count
    size = len(members) + beyond
    left = size - removed
    for least, what in ((job_spec.worker.min_replicas, "minReplicas"),
                        (job_spec.gang.min_available if job_spec.gang else 0,
                         "the gang's minAvailable")):  # fmt: skip
        if left < least:
            return [], (
                f"removing {removed} of {workers(size)} would leave {left}, below {what} {least}"
            )
    if hosts and victims and not [h for h in hosts if h not in victims]:
        return [], "would remove every worker in the host list; Horovod needs one to keep state"
    return by_index(job_spec.name, victims), None


def check_scale_out(
    job_spec: JobSpec, members: list[str], spec: ScalerSpec, beyond: int = 0
) -> str | None:
    assert spec.count is not None
    limit, what = job_spec.worker.max_replicas, "maxReplicas"
    if limit is None or limit > job_spec.worker.limit:
        limit, what = job_spec.worker.limit, "this operator's limit of workers per job"
    size = len(members) + beyond  # a queued job's asked, not running, are of its size
    if size + spec.count > limit:
        return f"adding {spec.count} to {workers(size)} would exceed {what} {limit}; nothing added"
    return None


def script_argv(spec: ScalerSpec, pods: list[str], slots: int) -> list[str]:
    """The scaler's script called as the Go operator called it, `timeout <t> sh <script>
    pod1:slots,pod2:slots`, so scripts written for it work unchanged; but as an argv list, with
    `env` setting the variables: values arrive as written, no shell parses them."""
    assert spec.script is not None
    return [
        "timeout",
        str(spec.timeout),
        "env",
        *(f"{k}={v}" for k, v in spec.env),
        "sh",
        spec.script,
        ",".join(f"{pod}:{slots}" for pod in pods),
    ]


def lone_host_waits(job_spec: JobSpec) -> bool:
    """The launcher runs elastic horovodrun without --network-interface: Horovod then waits for
    two hosts to find their common interfaces (gloo_run._get_min_start_hosts), so a run of one
    worker never starts training (it times out after --elastic-timeout, 600 s by default)."""
    containers = (job_spec.launcher.template.get("spec") or {}).get("containers") or [{}]
    argv = [
        str(a) for a in (containers[0].get("command") or []) + (containers[0].get("args") or [])
    ]
    words = " ".join(argv).split()
    elastic = any(w.startswith("--host-discovery-script") for w in words)
    named = any(w.startswith(("--network-interface", "--network-interfaces")) for w in words)
    return any(w.endswith("horovodrun") for w in words) and elastic and not named


def scaler_order(s: ScalerView) -> tuple[str, str]:
    return (s.created, s.name)
