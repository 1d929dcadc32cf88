"""Membership of a live run: lost and preempted workers, replacements, the host list, and the
launcher that trains on it. `running` is the pass; each step takes the membership the previous
one left (a frozen `Members`) and hands on its own."""

from __future__ import annotations

from etoperator import naming
from etoperator import status as st
from etoperator.planning.base import Base, Members
from etoperator.planning.rules import by_index, replaces, workers
from etoperator.planning.views import PodView, ScalerView
from etoperator.status import Event

SSH_RETRY = 0.2  # seconds between probes of a worker whose container runs but sshd does not yet


class Membership(Base):
    def running(self) -> None:
        start = int(self.s.run_start_index if self.s.run_start_index is not None else 0)
        m, active = self.current()
        launcher = self.drop_old_run(start)
        launched = st.is_true(self.s.conditions or [], "LauncherCreated")
        newcomers = set(active.planned) if active and active.kind == naming.SCALEOUT_KIND else set()
        victims = set(active.planned) if active and active.kind == naming.SCALEIN_KIND else set()
        lost = self.drop_lost(m, newcomers, victims, launched)
        if lost is None:
            return  # the job failed
        m, broken = lost
        self.prune(m, start, victims)
        if active is not None and active.kind == naming.SCALEOUT_KIND:
            m = self.drive_scale_out(active, m, broken)
        elif active is not None:
            m = self.drive_scale_in(active, m)
        m = m.sorted(self.job().name)
        self.s.target_workers = list(m.members)
        self.say_pending(m)
        after = self.launch(m, launcher, launched, newcomers)
        if after is None:
            return  # the job ended
        self.s.current_workers = by_index(self.job().name, list(after.hosts))
        self.plan.hosts = self.s.current_workers
        if self.s.phase in (st.RUNNING, st.SCALING):
            self.start_scalers()
            self.replicas()
            self.s.phase = st.SCALING if self.s.current_scaler else st.RUNNING
        waiting = [self.workers.get(n) for n in self.s.target_workers]
        if any(not (w and w.ready) for w in waiting):
            self.again("members not ready yet")
        if any(w and w.phase == "Running" and not w.ready and not w.deleting for w in waiting):
            # Its container runs and its sshd is starting: look again as soon as it may listen.
            self.plan.requeue = SSH_RETRY

    def current(self) -> tuple[Members, ScalerView | None]:
        """The membership the status holds, and the scaler running (a deleted one undone)."""
        members = tuple(self.s.target_workers or [])
        m = Members(members, tuple(h for h in self.s.current_workers or [] if h in members))
        active = self.active_scaler()
        if active is None and self.s.current_scaler:
            ref = naming.parse_scaler_ref(str(self.s.current_scaler))
            if ref is not None and (ref[0], ref[2]) not in self.scalers:
                m = self.cancel_scale(ref[0], ref[2], m)
            self.s.current_scaler = ""
        return m, active

    def drop_old_run(self, start: int) -> PodView | None:
        """Pods of earlier runs go; the launcher of this run, if there is one."""
        for pod in self.workers.values():
            if pod.index is not None and pod.index < start:
                self.delete(pod.name)
        launcher = self.launcher
        if launcher is not None and launcher.run != (self.s.restart_count or 0):
            self.delete(launcher.name)
            self.again("the launcher of an earlier run goes")
            return None
        return launcher

    def drop_lost(
        self, m: Members, newcomers: set[str], victims: set[str], launched: bool
    ) -> tuple[Members, list[str]] | None:
        """Lost workers leave the host list at once and are replaced per restartPolicy; the
        new workers of a ScaleOut that were lost (it fails). None: the job failed."""
        broken: list[str] = []
        for name in list(m.members):
            member = self.workers.get(name)
            if not (member.gone_bad if member else name in m.hosts):
                continue
            m = m.without(name)
            if member is not None and not member.draining:
                self.delete(name)
            if name in newcomers:
                broken.append(name)
            elif name not in victims:
                replaced = self.replace_lost(name, member, launched)
                if replaced is None:
                    self.s.target_workers, self.s.current_workers = (
                        list(m.members),
                        list(m.hosts),
                    )
                    self.fail_job(
                        "WorkerFailed",
                        f"worker {name} {self.describe_loss(member)} before training started",
                    )
                    return None
                m = m.adding(*replaced)
        return m, broken

    def replace_lost(self, name: str, member: PodView | None, launched: bool) -> list[str] | None:
        """Said on the job; the replacement's name ([] when none is due; None: fail the job)."""
        job, why = self.job(), self.describe_loss(member)
        message = f"worker {name} {why}; removed from the host list"
        self.plan.events.append(Event("Warning", "WorkerLost", message))
        if member is not None and member.leaving:
            notice = f"worker {name} {why}; left the host list before being stopped"
            self.cond("WorkerPreempted", "True", "PreemptionNotice", notice)
        if replaces(job.worker.restart_policy, member):
            index = self.last_index() + 1
            self.s.last_worker_index = index
            new = naming.worker_name(job.name, index)
            self.plan.events.append(
                Event("Normal", "WorkerReplaced", f"worker {name} replaced by {new}")
            )
            return [new]
        return [] if launched else None

    def prune(self, m: Members, start: int, victims: set[str]) -> None:
        """Pods of this run that are not members go, unless Horovod may still run on them: a
        ScaleIn victim (its scaler decides), or a preempted worker until Horovod left it
        (deleting it sooner would kill training mid-step; its node takes it anyway). Members
        without a pod are created (a name is free once its old pod is gone)."""
        for pod in self.workers.values():
            if pod.index is None or pod.index < start or pod.name in m.members:
                continue
            if pod.name in victims and not pod.gone_bad:
                continue
            if pod.draining and pod.busy is not False:
                self.again("a preempted worker still drains")
                continue
            self.delete(pod.name)
        for name in m.members:
            wanted = naming.worker_index(self.job().name, name)
            if name not in self.workers and wanted is not None:
                self.plan.create_workers.append(wanted)

    def launch(
        self, m: Members, launcher: PodView | None, launched: bool, newcomers: set[str]
    ) -> Members | None:
        """The launcher: created once every member is ready, seen, then followed to its end
        (None: the job ended). Ready members join the host list once it runs, except those a
        running ScaleOut admits together."""
        ready = [n for n in m.members if self.workers.get(n) and self.workers[n].ready]
        if launcher is not None and not launched:
            message = f"launcher {launcher.name} created"
            self.cond("LauncherCreated", "True", "LauncherCreated", message)
            launched = True
        if not launched:
            if self.launcher is None and m.members and len(ready) == len(m.members):
                m = Members(m.members, m.members)
                self.plan.create_launcher = True
                self.workers_ready(len(m.members), event=True)
            self.again("waiting to start the launcher")
            return m
        m = m.hosting(*(n for n in ready if n not in newcomers))
        self.workers_ready(len(m.hosts), event=False)
        return self.follow_launcher(m, launcher)

    def say_pending(self, m: Members) -> None:
        """WorkersPending: members whose pods say they cannot run (unschedulable, an image that
        cannot be had), in their own words; a Warning event when that changes."""
        stuck = [
            f"{n}: {self.workers[n].waiting}"
            for n in m.members
            if n in self.workers and self.workers[n].waiting and not self.workers[n].ready
        ]
        if stuck:
            self.cond("WorkersPending", "True", "WorkersPending", "; ".join(stuck), warn=True)
        elif st.is_true(self.s.conditions or [], "WorkersPending"):
            self.cond("WorkersPending", "False", "WorkersRunning", "every worker can run")

    def workers_ready(self, count: int, event: bool) -> None:
        """WorkersReady with the number of workers in the host list now (kept current after
        scales without a new event)."""
        verb = "accepts" if count == 1 else "accept"
        message = f"{workers(count)} {verb} the job's SSH key"
        self.cond("WorkersReady", "True", "WorkersReady", message, event=event)

    def follow_launcher(self, m: Members, launcher: PodView | None) -> Members | None:
        job = self.job()
        name = naming.launcher_name(job.name)
        if launcher is None or launcher.deleting:
            if job.launcher.restart_policy not in ("Always", "OnFailure"):
                self.s.target_workers, self.s.current_workers = list(m.members), list(m.hosts)
                why = "disappeared and its restartPolicy does not recreate it"
                self.fail_job("LauncherLost", f"launcher {name} {why}")
                return None
            self.plan.create_launcher = launcher is None
            message = f"launcher {name} was lost; recreating it"
            self.plan.events.append(Event("Warning", "LauncherRecreated", message))
            self.again("the launcher is being recreated")
        elif launcher.phase in ("Succeeded", "Failed"):
            self.s.current_workers = by_index(job.name, list(m.hosts))
            if launcher.phase == "Succeeded":
                self.succeed_job()
            else:
                self.launcher_failed(launcher)
            return None
        elif launcher.phase == "Running":
            if self.s.phase == st.CREATED:
                self.cond(st.RUNNING, "True", "Running", "the launcher is running")
            self.s.phase = st.RUNNING
        else:
            self.again("the launcher is not running yet")
        return m

    def cancel_scale(self, kind: str, name: str, m: Members) -> Members:
        """The running scaler was deleted: undo what it had not finished."""
        pods = list(self.s.scaler_pods or [])
        if kind == naming.SCALEOUT_KIND:
            m = m.without(*pods)
            what = f"its new workers are removed: {', '.join(pods)}"
        else:
            back = [
                p
                for p in pods
                if p in self.workers and not self.workers[p].gone_bad and p not in m.members
            ]
            m = m.adding(*back)
            what = f"its workers stay: {', '.join(back) or 'none left'}"
        message = f"{kind} {name} was deleted while it ran; {what}"
        self.cond(st.SCALING, "False", "ScaleCancelled", message)
        self.plan.events.append(Event("Warning", "ScaleCancelled", message))
        return m

    def describe_loss(self, pod: PodView | None) -> str:
        if pod is None:
            return "disappeared"
        if pod.leaving:
            return f"is about to be taken away ({pod.leaving})"
        if pod.deleting:
            return "is being deleted"
        detail = f", exit code {pod.exit_code}" if pod.exit_code is not None else ""
        reason = f" ({pod.reason}{detail})" if pod.reason or detail else ""
        return f"ended {pod.phase}{reason}"
