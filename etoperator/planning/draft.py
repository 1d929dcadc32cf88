"""A pass's Draft: its input, the status it is writing and the plan it is building, with the
few operations on them every step uses (conditions, deletions, the membership, a fresh run).
Steps are functions in lifecycle.py, membership.py, scaling.py, scalerqueue.py and ends.py that
take the Draft."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from etoperator import naming
from etoperator import status as st
from etoperator.api.models import JobSpec
from etoperator.api.statuses import JobStatus, ScalerStatus
from etoperator.builders import runtimes
from etoperator.clock import iso, parse_iso
from etoperator.planning.kinds import (
    DeletePod,
    DeleteWorkload,
    HostList,
    MakeWorkload,
    ScalerStatusWrite,
    SpecReplicas,
    UpdateWorkload,
)
from etoperator.planning.phases import Happened, next_phase
from etoperator.planning.plan import Plan
from etoperator.planning.rules import by_index, lone_host_waits
from etoperator.planning.views import JobInput, ScalerView
from etoperator.status import Event


@dataclass(frozen=True)
class Members:
    """The membership one step of a pass hands to the next: the pods the run should have, and
    those in Horovod's host list (always members too)."""

    members: tuple[str, ...]
    hosts: tuple[str, ...]

    def without(self, *names: str) -> Members:
        return Members(
            tuple(n for n in self.members if n not in names),
            tuple(h for h in self.hosts if h not in names),
        )

    def adding(self, *names: str) -> Members:
        return replace(
            self, members=self.members + tuple(n for n in names if n not in self.members)
        )

    def hosting(self, *names: str) -> Members:
        return replace(self, hosts=self.hosts + tuple(n for n in names if n not in self.hosts))

    def sorted(self, job: str) -> Members:
        return Members(
            tuple(by_index(job, list(self.members))), tuple(by_index(job, list(self.hosts)))
        )


class Draft:
    """One pass's working state; `plan_job` makes one per pass and drops it after."""

    def __init__(self, inp: JobInput) -> None:
        self.inp = inp
        self.now = iso(inp.now)
        self.status_read = copy.deepcopy(inp.status)  # what the pass started from
        self.status = copy.deepcopy(inp.status)  # what the pass will write
        self.plan = Plan(status=self.status)
        self.workers = {p.name: p for p in inp.pods if p.role == naming.ROLE_WORKER}
        self.launcher = next((p for p in inp.pods if p.role == naming.ROLE_LAUNCHER), None)
        self.scalers = {s.kind_name: s for s in inp.scalers}
        self.pending: list[str] = []  # what is in flight (then the next pass comes soon)
        self.watching: list[str] = []  # what the watches will tell of (pods starting)
        self.happened = Happened()  # what decides the phase (phases.py)
        self.creating: list[int] = []  # workers to make, as the steps ask (complete_plan)
        # A queued job's workers asked for and not running (Kueue admitted fewer, or not
        # yet): part of its size in every scale's count (scalerqueue.py), never dropped by one.
        self.beyond = self.queued_beyond(self.status_read)

    def queued_beyond(self, status: JobStatus) -> int:
        if self.inp.queue is None or status.accepted_replicas is None:
            return 0
        return max(0, status.accepted_replicas - len(status.members))

    @property
    def phase(self) -> str | None:
        """The job's phase as the pass has it so far (written once, at its end)."""
        scaling = bool(self.status.current_scaler)
        return next_phase(self.status_read.phase, self.happened, scaling)

    def set_cond(
        self,
        ctype: str,
        status: str,
        reason: str,
        message: str,
        warn: bool = False,
        event: bool = True,
    ) -> None:
        """Set a job condition; a change to True is told as an Event too (unless `event` is
        off: a message kept current, such as a count, is not news)."""
        conds, changed = st.set_condition(
            self.status.conditions or [], ctype, status, reason, message, self.now
        )
        self.status.conditions = conds
        if changed and status == "True" and event:
            self.plan.tell(Event("Warning" if warn else "Normal", reason, message))

    def set_scaler_cond(
        self, sc: ScalerView, phase: str, ctype: str, reason: str, message: str, warn: bool = False
    ) -> None:
        new = copy.deepcopy(self.plan.scaler_status.get(sc.kind_name, sc.status))
        if new.phase in st.SCALE_TERMINAL and phase != new.phase:
            return  # a scaler's end is written once and never changes
        conds, changed = st.set_condition(
            new.conditions or [], ctype, "True", reason, message, self.now
        )
        if phase in st.SCALE_TERMINAL and st.condition(conds, st.SCALE_RUNNING):
            # Ended: it no longer scales (describe showed Scaling=True beside the end).
            conds, _ = st.set_condition(
                conds, st.SCALE_RUNNING, "False", reason, f"ended: {message}", self.now
            )
        new.conditions, new.phase = conds, phase
        if phase in st.SCALE_TERMINAL:
            new.completion_time = new.completion_time or self.now
            started = parse_iso(new.start_time)
            secs = (self.inp.now - started).total_seconds() if started else 0.0
            result = "succeeded" if phase == st.SCALE_SUCCEEDED else "failed"
            self.plan.settled_scalers.append((sc.kind, result, f"{secs:.3f}"))
        if new != sc.status:
            self.scaler_status(sc.kind_name, new)
        if changed:
            event = Event("Warning" if warn else "Normal", reason, message)
            self.plan.tell(event, sc.kind_name)
            if phase in st.SCALE_TERMINAL:  # `kubectl describe tj` tells how each scale ended
                self.plan.tell(Event(event.type, reason, f"{sc.kind} {sc.name}: {message}"))

    def scaler_status(self, kind_name: tuple[str, str], new: ScalerStatus) -> None:
        """A scaler's status as the pass writes it (one write a scaler)."""
        write = ScalerStatusWrite(kind_name, new)
        self.plan.emit(
            write, lambda w: isinstance(w, ScalerStatusWrite) and w.kind_name == kind_name
        )

    def fail_scaler(self, sc: ScalerView, reason: str, message: str) -> None:
        self.set_scaler_cond(sc, st.SCALE_FAILED, st.SCALE_FAILED, reason, message, warn=True)

    def delete(self, name: str) -> None:
        pod = self.workers.get(name) or (
            self.launcher if self.launcher and self.launcher.name == name else None
        )
        if pod is not None and not pod.deleting and name not in self.plan.delete_pods:
            self.plan.emit(DeletePod(name, False))

    @property
    def spec(self) -> JobSpec:
        assert self.inp.spec is not None
        return self.inp.spec

    def run_size(self) -> int:
        """Workers a new run starts with: spec replicas, or as many as Kueue admitted."""
        q = self.inp.queue
        if q is not None and q.admitted and not q.evicted:
            return min(q.room, self.spec.worker.replicas)
        return self.spec.worker.replicas

    def set_members(self, m: Members, publish: bool = True) -> None:
        """The run's membership, written here and nowhere else: targetWorkers (`m.members`)
        and currentWorkers (`m.hosts`, by index); with `publish`, also the host list this
        pass gives Horovod (the ConfigMap's)."""
        self.status.target_workers = list(m.members)
        self.status.current_workers = by_index(self.spec.name, list(m.hosts))
        if publish:
            self.plan.put(HostList(tuple(self.status.current_workers)))

    def scale_started(self, sc: ScalerView, planned: list[str]) -> None:
        """The job's running scale, written here and in `scale_ended` only: currentScaler names
        it, scalerPods holds its frozen plan (to undo it if it is deleted while it runs)."""
        self.status.current_scaler = naming.scaler_ref(sc.kind, self.inp.namespace, sc.name)
        self.status.scaler_pods = list(planned)

    def scale_ended(self) -> None:
        """No scale runs (the next may start)."""
        self.status.current_scaler = ""
        self.status.scaler_pods = None

    def start_fresh_run(self) -> None:
        """Membership for a new run: fresh indices, an empty host list."""
        job_spec = self.spec
        indices = self.new_indices(self.run_size())
        self.status.run_start_index = indices.start
        self.set_members(Members(tuple(naming.worker_name(job_spec.name, i) for i in indices), ()))
        self.accept_replicas(job_spec.worker.replicas)
        self.beyond = self.queued_beyond(self.status)
        self.happened.fresh = True
        if len(indices) == 1 and lone_host_waits(job_spec):
            why = (
                "the run starts with one worker, and horovodrun without --network-interface "
                "waits for two hosts to find their common network interfaces: it trains once "
                "a second worker joins, or fails at its --elastic-timeout (give "
                "--network-interface, e.g. eth0)"
            )
            self.plan.tell(Event("Warning", "HorovodWaitsForTwoHosts", why))
        for ctype in ("WorkersReady", "LauncherCreated", "Running"):
            if st.condition(self.status.conditions or [], ctype):
                self.set_cond(ctype, "False", "NewRun", "a new run is starting")

    def stop_run(self, reason: str, message: str) -> None:
        """Every pod goes (a Horovod run's launcher first: runtimes.launcher_stops_first) and the
        run's membership with it; a running scale fails (spec replicas go back to the size
        before it, for the next run). A torchrun run's pods go in one pass, its launcher's
        delete written first: a worker's leave that reaches the rendezvous before the
        launcher's preStop asked for the save finds the launcher's pod being deleted
        (rendezvous.py), not a membership change."""
        active = self.active_scaler()
        if active is not None:
            before = set(self.status.target_workers or []) ^ set(active.planned)
            self.follow_members(len(before))
        # While the launcher runs, its preStop may be asking the training to save.
        training = self.launcher is not None and self.launcher.phase == "Running"
        first = runtimes.of(self.spec).launcher_stops_first
        saving = first and training
        now = []
        for pod in sorted(self.inp.pods, key=lambda p: p.role != naming.ROLE_LAUNCHER):
            running = pod.role == naming.ROLE_WORKER and pod.phase == "Running"
            if saving and running:
                continue  # until the launcher, asking for a save as it stops, is gone
            self.delete(pod.name)
            if first and running:
                now.append(pod.name)
        self.plan.stop_at_once(now)  # one pass over the writes, not one a pod
        if saving:
            self.await_pods("the launcher stops first, asking the training to save")
        # The host list Horovod reads empties once the launcher is gone (complete_plan): an
        # empty list would end the training before the launcher's preStop asked it to save.
        self.set_members(Members((), ()), publish=not training)
        if active is not None:
            self.fail_scaler(active, reason, message)
            self.set_cond(st.SCALING, "False", reason, f"{active.kind} {active.name}: {message}")
        self.scale_ended()

    def follow_members(self, members: int) -> None:
        worker, gang = self.spec.worker, self.spec.gang
        # Never below what the spec check refuses (a refused edit would hold the whole job).
        wanted = max(members + self.beyond, worker.min_replicas, gang.min_available if gang else 0)
        if worker.max_replicas is not None:
            wanted = min(wanted, worker.max_replicas)  # the schema refuses anything else
        if wanted == worker.replicas:
            self.accept_replicas(wanted)
            return
        self.status.accepted_replicas = wanted
        self.status.replicas_before = worker.replicas
        self.plan.put(SpecReplicas(wanted))

    def accept_replicas(self, replicas: int) -> None:
        self.status.accepted_replicas = replicas
        self.status.replicas_before = None

    def last_index(self) -> int:
        seen = [p.index for p in self.workers.values() if p.index is not None]
        last = self.status.last_worker_index
        return max([last if last is not None else -1, *seen])

    def new_indices(self, count: int) -> range:
        """Indices no worker of the job ever had, taken (lastWorkerIndex is written here and
        in `unname_run` only): a name is never used twice."""
        first = self.last_index() + 1
        self.status.last_worker_index = first + count - 1
        return range(first, first + count)

    def unname_run(self) -> None:
        """The names a run that never started took are free again (its first pass named
        them, then the job was queued before any pod was made)."""
        self.status.last_worker_index = (self.status.run_start_index or 0) - 1

    def to_kueue(self, write: DeleteWorkload | MakeWorkload) -> None:
        """A Workload made or deleted: once a pass (a second of a name replaces the first)."""
        self.plan.emit(
            write, lambda w: type(w) is type(write) and getattr(w, "name", None) == write.name
        )

    def update_workload(
        self,
        core: bool,
        resize: int | None = None,
        activate: bool | None = None,
        condition: tuple[str, str, str, str] | None = None,
        release: str = "",
    ) -> None:
        """A family's current Workload brought up to date: one write a pass, a later value
        of a field over an earlier one, conditions added."""
        old = self.plan.updated(core)
        new = UpdateWorkload(
            core,
            resize if resize is not None else old.resize,
            activate if activate is not None else old.activate,
            old.conditions + ((condition,) if condition else ()),
            release or old.release,
        )
        self.plan.emit(new, lambda w: w == old)

    def active_scaler(self) -> ScalerView | None:
        ref = naming.parse_scaler_ref(str(self.status.current_scaler or ""))
        if ref is None:
            return None
        sc = self.scalers.get((ref[0], ref[2]))
        if sc is None or sc.phase in st.SCALE_TERMINAL:
            return None
        # Started: its frozen plan written (a ScaleIn taking only workers asked and not
        # admitted has an empty one, and its start time).
        return sc if sc.planned or sc.status.start_time else None

    def run_goes_on(self) -> bool:
        """The run's launcher is there and not going. Said of a job Suspended or Queued that
        is neither suspended nor held by its queue now: nothing stopped the run, so that phase
        was written by someone else (with status rights), and the run goes on; only a run
        that stopped starts afresh."""
        launcher = self.launcher
        return launcher is not None and not launcher.deleting and not launcher.gone_bad

    def come_back(self, why: str) -> None:
        """Something is in flight: come back soon (a watch event may not tell of it)."""
        if why not in self.pending:
            self.pending.append(why)

    def await_pods(self, why: str) -> None:
        """Waiting on pods to start: their watch events bring the next pass. No sooner: while
        thousands of pods wait for nodes or images, a pass per job a second would be the
        operator's whole load, and every one would find the same."""
        if why not in self.watching:
            self.watching.append(why)
