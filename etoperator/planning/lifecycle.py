"""A job's life: a new run, restarts, success and failure, suspension, an invalid spec."""

from __future__ import annotations

from etoperator import naming
from etoperator import status as st
from etoperator.planning.base import Base
from etoperator.planning.views import Plan, PodView
from etoperator.status import Event


class Lifecycle(Base):
    def run(self) -> Plan:
        inp = self.inp
        self.s.conditions = self.s.conditions if self.s.conditions is not None else []
        if inp.spec is None:
            self.invalid(inp.error or "invalid spec")
            return self.finish()
        job = inp.spec
        failed_cond = st.condition(self.s.conditions, st.FAILED)
        if self.s.phase == st.FAILED and failed_cond and failed_cond.get("reason") == "InvalidSpec":
            # The spec was fixed after being refused: nothing was ever started, begin afresh.
            self.cond(st.FAILED, "False", "SpecFixed", "the spec is valid now")
            self.s.phase = None
            self.s.completion_time = None
        self.s.worker_selector = naming.worker_selector(job.name)
        if inp.public_key:
            self.s.ssh_public_key = inp.public_key
        self.adopt_scalers()
        if not self.s.phase:
            self.s.start_time = self.s.start_time or self.now
            self.s.restart_count = self.s.restart_count if self.s.restart_count is not None else 0
            self.fresh_run()
            self.cond(st.CREATED, "True", "TrainingJobCreated", f"job {job.name} is created")
        self.blocked()
        phase = self.s.phase
        if inp.hold and phase not in st.TERMINAL:
            self.plan.requeue = 5.0
            return self.plan  # status only: nothing moves until the job's basics are there
        if phase in st.TERMINAL:
            self.finished()
        elif job.suspended:
            self.suspend()
        elif phase == st.SUSPENDED:
            self.fresh_run()
            self.cond(st.SUSPENDED, "False", "Resumed", "job resumed")
            self.plan.events.append(Event("Normal", "Resumed", "job resumed: starting afresh"))
            self.running()
        else:
            self.running()
        return self.finish()

    def blocked(self) -> None:
        """Blocked/ChildConflict while something of ours is in the way, cleared once it is not;
        Blocked/APIRefused (set when a write was refused) cleared once writes pass again."""
        current = st.condition(self.s.conditions or [], "Blocked") or {}
        reason = current.get("reason") if current.get("status") == "True" else None
        if self.inp.problems:
            message = "; ".join(self.inp.problems)
            self.cond("Blocked", "True", "ChildConflict", message, warn=True)
        elif reason == "ChildConflict":
            self.cond("Blocked", "False", "Resolved", "nothing blocks the job")
        elif reason == "APIRefused" and self.inp.refusal_over:
            self.cond("Blocked", "False", "Resolved", "the API server accepts the job's writes")

    def invalid(self, error: str) -> None:
        if self.s.phase != st.FAILED:
            self.s.phase = st.FAILED
            self.s.completion_time = self.now
        self.cond(st.FAILED, "True", "InvalidSpec", error, warn=True)
        for sc in self.inp.scalers:
            if sc.phase not in st.SCALE_TERMINAL:
                self.fail_scaler(sc, "JobInvalid", f"job {self.inp.name} is invalid: {error}")

    def adopt_scalers(self) -> None:
        for sc in self.inp.scalers:
            if not sc.owned and sc.phase not in st.SCALE_TERMINAL:
                self.plan.adopt_scalers.append(sc.key)

    def finished(self) -> None:
        job = self.job()
        for pod in self.inp.pods:
            if job.clean_pod_policy == "All" or (
                job.clean_pod_policy == "Running" and pod.phase in ("Pending", "Running")
            ):
                self.delete(pod.name)
        current = self.inp.status.get("currentScaler") or ""
        self.s.current_scaler = ""
        for sc in self.inp.scalers:
            # One that started but is not the job's current scaler has ended already: our own
            # write of its end is what the cache has yet to show.
            started = sc.phase == st.SCALE_RUNNING
            ref = naming.scaler_ref(sc.kind, self.inp.namespace, sc.name)
            if sc.phase not in st.SCALE_TERMINAL and (not started or ref == current):
                self.fail_scaler(
                    sc, "JobFinished", f"job {job.name} ended {self.s.phase}; nothing scaled"
                )

    def suspend(self) -> None:
        active = self.active_scaler()
        if active is not None:  # the size before it, for the resume (it showed its target)
            before = set(self.s.target_workers or []) ^ set(active.planned)
            self.follow(len(before))
        for pod in self.inp.pods:
            self.delete(pod.name)
        self.s.target_workers = []
        self.s.current_workers = []
        self.plan.hosts = []
        self.s.phase = st.SUSPENDED
        self.fail_active("JobSuspended", "the job was suspended")
        self.s.current_scaler = ""
        self.cond(st.SUSPENDED, "True", "Suspended", "job suspended: all pods deleted")

    def fail_active(self, reason: str, message: str) -> None:
        active = self.active_scaler()
        if active is not None:
            self.fail_scaler(active, reason, message)

    def fail_job(self, reason: str, message: str) -> None:
        self.s.phase = st.FAILED
        self.s.completion_time = self.now
        self.cond(st.FAILED, "True", reason, message, warn=True)
        self.finished()

    def succeed_job(self) -> None:
        self.s.phase = st.SUCCEEDED
        self.s.completion_time = self.now
        self.cond(st.SUCCEEDED, "True", "Succeeded", "the launcher completed successfully")
        self.finished()

    def launcher_failed(self, launcher: PodView) -> None:
        job = self.job()
        count = int(self.s.restart_count if self.s.restart_count is not None else 0)
        why = f"the launcher failed ({launcher.reason or 'Error'}, exit code {launcher.exit_code})"
        if job.restart_policy == "OnFailure" and count < job.backoff_limit:
            self.fail_active("JobRestarted", "the job restarted; scale not applied")
            self.s.current_scaler = ""
            self.s.restart_count = count + 1
            for pod in self.inp.pods:
                self.delete(pod.name)
            self.fresh_run()
            self.plan.hosts = []
            self.cond(
                "Restarting",
                "True",
                "Restarting",
                f"{why}; restart {count + 1} of {job.backoff_limit}",
                warn=True,
            )
            self.again("restarting")
            return
        limit = (
            f"; backoffLimit {job.backoff_limit} reached"
            if job.restart_policy == "OnFailure"
            else ""
        )
        self.fail_job("LauncherFailed", why + limit)

    def finish(self) -> Plan:
        job = self.inp.spec
        if job is not None:
            members = set(self.s.target_workers or [])
            wanted = {naming.worker_index(job.name, m) for m in members}
            self.plan.create_workers = sorted(set(self.plan.create_workers) & wanted)
            keep = {
                p.name
                for p in self.workers.values()
                if not p.deleting and p.name not in self.plan.delete_pods
            }
            keep |= {naming.worker_name(job.name, i) for i in self.plan.create_workers}
            if self.s.phase not in st.TERMINAL:
                keep |= members
            self.plan.services = sorted(keep)

            run_pods = [
                p
                for p in self.inp.pods
                if p.role == naming.ROLE_LAUNCHER or (p.index or 0) >= (self.s.run_start_index or 0)
            ]
            self.s.replica_statuses = {
                "Launcher": st.replica_counts(
                    p.phase for p in run_pods if p.role == naming.ROLE_LAUNCHER
                ),
                "Worker": st.replica_counts(
                    p.phase for p in run_pods if p.role == naming.ROLE_WORKER
                ),
            }
            self.s.replicas = len(self.s.current_workers or [])
        if not self.s.current_scaler:
            self.s.scaler_pods = None
        self.s.observed_generation = self.inp.generation
        self.plan.pending = list(self.pending)
        if self.pending or self.plan.create_workers or self.plan.delete_pods:
            self.plan.requeue = min(self.plan.requeue, 1.0)
        return self.plan
