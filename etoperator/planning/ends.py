"""How a run ends: the job fails or succeeds, a failed launcher restarts the run or fails the
job, and what an ended job leaves behind (its pods per cleanPodPolicy, its scalers failed)."""

from __future__ import annotations

from etoperator import naming
from etoperator import status as st
from etoperator.planning.draft import Draft
from etoperator.planning.views import PodView


def wind_down(d: Draft) -> None:
    job_spec = d.spec
    for pod in d.inp.pods:
        if job_spec.clean_pod_policy == "All" or (
            job_spec.clean_pod_policy == "Running" and pod.phase in ("Pending", "Running")
        ):
            d.delete(pod.name)
    current = d.status_read.current_scaler or ""
    d.scale_ended()
    for sc in d.inp.scalers:
        # One that started but is not the job's current scaler has ended already: our own
        # write of its end is what the cache has yet to show.
        started = sc.phase == st.SCALE_RUNNING
        ref = naming.scaler_ref(sc.kind, d.inp.namespace, sc.name)
        if sc.phase not in st.SCALE_TERMINAL and (not started or ref == current):
            d.fail_scaler(sc, "JobFinished", f"job {job_spec.name} ended {d.phase}; nothing scaled")


def fail_active(d: Draft, reason: str, message: str) -> None:
    active = d.active_scaler()
    if active is not None:
        d.fail_scaler(active, reason, message)


def fail_job(d: Draft, reason: str, message: str) -> None:
    d.happened.ended = st.FAILED
    d.set_cond(st.FAILED, "True", reason, message, warn=True)
    wind_down(d)


def succeed_job(d: Draft) -> None:
    d.happened.ended = st.SUCCEEDED
    d.set_cond(st.SUCCEEDED, "True", "Succeeded", "the launcher completed successfully")
    wind_down(d)


def restart_or_fail(d: Draft, launcher: PodView) -> None:
    job_spec = d.spec
    count = int(d.status.restart_count if d.status.restart_count is not None else 0)
    why = f"the launcher failed ({launcher.reason or 'Error'}, exit code {launcher.exit_code})"
    if job_spec.restart_policy == "OnFailure" and count < job_spec.backoff_limit:
        fail_active(d, "JobRestarted", "the job restarted; scale not applied")
        d.scale_ended()
        d.status.restart_count = count + 1
        for pod in d.inp.pods:
            d.delete(pod.name)
        d.start_fresh_run()
        d.set_cond(
            "Restarting",
            "True",
            "Restarting",
            f"{why}; restart {count + 1} of {job_spec.backoff_limit}",
            warn=True,
        )
        d.come_back("restarting")
        return
    limit = (
        f"; backoffLimit {job_spec.backoff_limit} reached"
        if job_spec.restart_policy == "OnFailure"
        else ""
    )
    fail_job(d, "LauncherFailed", why + limit)
