"""Membership of a live run: lost and preempted workers, replacements, the host list, and the
launcher that trains on it. `advance_run` is the pass; each step takes the membership the previous
one left (a frozen `Members`) and hands on its own."""

from __future__ import annotations

from etoperator import naming
from etoperator import status as st
from etoperator.builders import runtimes
from etoperator.planning import surplus
from etoperator.planning.draft import Draft, Members
from etoperator.planning.ends import fail_job, restart_or_fail, succeed_job
from etoperator.planning.kinds import MakeLauncher
from etoperator.planning.rules import replaces, workers
from etoperator.planning.scalerqueue import follow_replicas, start_scalers
from etoperator.planning.scaling import drive_scale_in, drive_scale_out
from etoperator.planning.views import PodView, ScalerView
from etoperator.status import Event

SSH_RETRY = 0.2  # seconds between probes of a worker whose container runs but sshd does not yet


def advance_run(d: Draft) -> None:
    start = int(d.status.run_start_index if d.status.run_start_index is not None else 0)
    m, active = read_members(d)
    launched = st.is_true(d.status.conditions or [], "LauncherCreated")
    launcher = drop_old_run(d, start, launched)
    newcomers = set(active.planned) if active and active.kind == naming.SCALEOUT_KIND else set()
    victims = set(active.planned) if active and active.kind == naming.SCALEIN_KIND else set()
    m, taken = drop_reclaimed(d, m, newcomers)
    lost = drop_lost(d, m, newcomers, victims, launched)
    if lost is None:
        return  # the job failed
    shrunk = len(lost[0].members) < len(m.members)  # a lost worker not replaced
    m, broken = lost
    broken += taken
    prune(d, m, start, victims)
    if active is not None and active.kind == naming.SCALEOUT_KIND:
        m = drive_scale_out(d, active, m, broken)
    elif active is not None:
        m = drive_scale_in(d, active, m)
    m = m.sorted(d.spec.name)
    say_pending(d, m)
    after = launch(d, m, launcher, launched, newcomers)
    if after is None:
        return  # the job ended (the step that ended it wrote the membership it left)
    running = d.phase in (st.RUNNING, st.SCALING)
    d.set_members(start_scalers(d, after) if running else after)
    if running:
        follow_replicas(d, shrunk)
    waiting = [d.workers.get(n) for n in d.status.members]
    if any(not (w and w.ready) for w in waiting):
        d.await_pods("members not ready yet")
    if any(w and w.phase == "Pending" and not w.bound and not w.waiting for w in waiting):
        # No scheduler may ever take it up (a schedulerName that names none): nothing would
        # wake the job to say so; look again once that can be told (podviews.UNSCHEDULED).
        d.plan.requeue = min(d.plan.requeue, UNPLACED_RECHECK)
    if any(w and w.phase == "Running" and not w.ready and not w.deleting for w in waiting):
        # Its container runs and its sshd is starting: look again as soon as it may listen.
        d.plan.requeue = SSH_RETRY


UNPLACED_RECHECK = 21.0  # seconds: a pod with no scheduler's word is said after 20


def read_members(d: Draft) -> tuple[Members, ScalerView | None]:
    """The membership the status holds, and the scaler running (a deleted one undone)."""
    members = tuple(d.status.target_workers or [])
    m = Members(members, tuple(h for h in d.status.current_workers or [] if h in members))
    active = d.active_scaler()
    if active is None and d.status.current_scaler:
        ref = naming.parse_scaler_ref(str(d.status.current_scaler))
        if ref is not None and (ref[0], ref[2]) not in d.scalers:
            m = cancel_scale(d, ref[0], ref[2], m)
        d.scale_ended()
    return m, active


def drop_old_run(d: Draft, start: int, launched: bool) -> PodView | None:
    """Pods of earlier runs go; the launcher of this run, if there is one. A launcher going
    away before this run saw one of its own is an earlier run's (one deleted at a suspension
    and still terminating: a resumed run keeps its restart count)."""
    for pod in d.workers.values():
        if pod.index is not None and pod.index < start:
            d.delete(pod.name)
    launcher = d.launcher
    earlier = launcher is not None and launcher.deleting and not launched
    if launcher is not None and (earlier or launcher.run != (d.status.restart_count or 0)):
        d.delete(launcher.name)
        d.come_back("the launcher of an earlier run goes")
        return None
    return launcher


def drop_reclaimed(d: Draft, m: Members, newcomers: set[str]) -> tuple[Members, list[str]]:
    """Workers whose quota Kueue took back leave the host list at once, not replaced: the
    job's size asked stays (it grows back when the queue admits them again). Their pods go
    once Horovod has left them (prune); a ScaleOut's new worker among them fails it."""
    gone = [n for n in m.members if (w := d.workers.get(n)) is not None and w.reclaimed]
    if gone:
        surplus.say_reclaimed(d, gone)
    return m.without(*gone), [n for n in gone if n in newcomers]


def drop_lost(
    d: Draft, m: Members, newcomers: set[str], victims: set[str], launched: bool
) -> tuple[Members, list[str]] | None:
    """Lost workers leave the host list at once and are replaced per restartPolicy; the
    new workers of a ScaleOut that were lost (it fails). None: the job failed."""
    broken: list[str] = []
    for name in list(m.members):
        member = d.workers.get(name)
        if not (member.gone_bad if member else name in m.hosts) or agent_done(d, member):
            continue
        m = m.without(name)
        if member is not None and not member.draining:
            d.delete(name)
        if name in newcomers:
            broken.append(name)
        elif name not in victims:
            replaced = replace_lost(d, name, member, launched)
            if replaced is None:
                d.set_members(m, publish=False)
                fail_job(
                    d,
                    "WorkerFailed",
                    f"worker {name} {describe_loss(member)} before training started",
                )
                return None
            m = m.adding(*replaced)
    return m, broken


def agent_done(d: Draft, pod: PodView | None) -> bool:
    """A torchrun worker whose agent exited 0: the run's work is done (torch's exit barrier
    passed), and the run ends with its launcher; no loss, no smaller job."""
    return d.spec.torchrun and pod is not None and pod.phase == "Succeeded"


def replace_lost(d: Draft, name: str, member: PodView | None, launched: bool) -> list[str] | None:
    """Said on the job; the replacement's name ([] when none is due; None: fail the job)."""
    job_spec, why = d.spec, describe_loss(member)
    message = f"worker {name} {why}; removed from the host list"
    d.plan.tell(Event("Warning", "WorkerLost", message))
    if member is not None and member.leaving:
        notice = f"worker {name} {why}; left the host list before being stopped"
        d.set_cond("WorkerPreempted", "True", "PreemptionNotice", notice)
    if replaces(job_spec.worker.restart_policy, member):
        new = naming.worker_name(job_spec.name, d.new_indices(1).start)
        d.plan.tell(Event("Normal", "WorkerReplaced", f"worker {name} replaced by {new}"))
        return [new]
    return [] if launched else None


def prune(d: Draft, m: Members, start: int, victims: set[str]) -> None:
    """Pods of this run that are not members go, unless Horovod may still run on them: a
    ScaleIn victim (its scaler decides), or a preempted worker until Horovod left it
    (deleting it sooner would kill training mid-step; its node takes it anyway). Members
    without a pod are created (a name is free once its old pod is gone)."""
    for pod in d.workers.values():
        if pod.index is None or pod.index < start or pod.name in m.members:
            continue
        if pod.name in victims and not pod.gone_bad:
            continue
        if pod.draining and pod.busy is not False and not pod.overdue:
            d.come_back("a preempted worker still drains")
            continue
        d.delete(pod.name)
    for name in m.members:
        wanted = naming.worker_index(d.spec.name, name)
        if name not in d.workers and wanted is not None:
            d.creating.append(wanted)


def launch(
    d: Draft, m: Members, launcher: PodView | None, launched: bool, newcomers: set[str]
) -> Members | None:
    """The launcher: created once every member is ready, seen, then followed to its end
    (None: the job ended). Ready members join the host list once it runs, except those a
    running ScaleOut admits together."""
    ready = [n for n in m.members if d.workers.get(n) and d.workers[n].ready]
    if launcher is not None and not launched:
        message = f"launcher {launcher.name} created"
        d.set_cond("LauncherCreated", "True", "LauncherCreated", message)
        launched = True
    first = runtimes.of(d.spec).launcher_first
    if not launched:
        made = all(n in d.workers for n in m.members)  # seen: none taken for lost
        if d.launcher is None and m.members and ((first and made) or len(ready) == len(m.members)):
            # The host list holds the planned size: a rendezvous closes its first round there.
            m = Members(m.members, m.members)
            if d.inp.basics.launcher_ready:
                d.plan.put(MakeLauncher())
            if len(ready) == len(m.members):
                say_workers_ready(d, len(m.members), event=True)
        # Woken by the pods' events, and by those of the launcher's account, Role and binding.
        d.await_pods("waiting to start the launcher")
        return m
    m = m.hosting(*together(d, m, ready, newcomers))
    say_workers_ready(d, len(m.hosts), event=False)
    return follow_launcher(d, m, launcher)


# Seconds a ready new worker waits for others starting beside it to join the host list with.
JOIN_TOGETHER = 30.0


def together(d: Draft, m: Members, ready: list[str], newcomers: set[str]) -> list[str]:
    """The ready workers that join the host list now: outside a ScaleOut (Kueue admitting
    more, replacements) all in one change, as a ScaleOut's do. Each change resets Horovod's
    ranks, and one made while they reset for the last (a new rank still starting) is dropped
    at their reset: the job would never grow to that worker. So while another new worker is
    starting (placed, made less than JOIN_TOGETHER ago), the ready ones wait for it; one
    that is not placed, has failed or is late holds no one back, nor does a running
    ScaleOut's (`newcomers`: they join on its terms)."""
    joining = [n for n in ready if n not in m.hosts and n not in newcomers]
    starting = [
        n
        for n in m.members
        if n not in m.hosts and n not in newcomers
        and (v := d.workers.get(n)) is not None and v.bound and not v.gone_bad and not v.ready
        and v.age is not None and v.age < JOIN_TOGETHER
    ]  # fmt: skip
    if joining and starting:
        d.come_back(f"{', '.join(joining)} wait to join with {', '.join(starting)}")
        return []
    return joining


def say_pending(d: Draft, m: Members) -> None:
    """WorkersPending: members whose pods say they cannot run (unschedulable, an image that
    cannot be had), in their own words; a Warning event when that changes."""
    stuck = [
        f"{n}: {d.workers[n].waiting}"
        for n in m.members
        if n in d.workers and d.workers[n].waiting and not d.workers[n].ready
    ]
    if stuck:
        d.set_cond("WorkersPending", "True", "WorkersPending", "; ".join(stuck), warn=True)
    elif st.is_true(d.status.conditions or [], "WorkersPending"):
        d.set_cond("WorkersPending", "False", "WorkersRunning", "every worker can run")


def say_workers_ready(d: Draft, count: int, event: bool) -> None:
    """WorkersReady with the number of workers in the host list now (kept current after
    scales without a new event)."""
    one, many = runtimes.of(d.spec).ready_words
    message = f"{workers(count)} {one if count == 1 else many}"
    d.set_cond("WorkersReady", "True", "WorkersReady", message, event=event)


def follow_launcher(d: Draft, m: Members, launcher: PodView | None) -> Members | None:
    job_spec = d.spec
    name = naming.launcher_name(job_spec.name)
    if launcher is None or launcher.deleting:
        if job_spec.launcher.restart_policy not in ("Always", "OnFailure"):
            d.set_members(m, publish=False)
            why = "disappeared and its restartPolicy does not recreate it"
            fail_job(d, "LauncherLost", f"launcher {name} {why}")
            return None
        if launcher is None:
            d.plan.put(MakeLauncher())
        message = f"launcher {name} was lost; recreating it"
        d.plan.tell(Event("Warning", "LauncherRecreated", message))
        d.come_back("the launcher is being recreated")
    elif launcher.phase in ("Succeeded", "Failed"):
        d.set_members(m, publish=False)
        if launcher.phase == "Succeeded":
            succeed_job(d)
        else:
            restart_or_fail(d, launcher)
        return None
    elif launcher.phase == "Running":
        if d.phase == st.CREATED:
            d.set_cond(st.RUNNING, "True", "Running", "the launcher is running")
        d.happened.launcher_running = True
        say_launcher_pending(d, launcher)
    else:
        say_launcher_pending(d, launcher)
        d.await_pods("the launcher is not running yet")
    return m


def say_launcher_pending(d: Draft, launcher: PodView) -> None:
    """LauncherPending: the launcher's pod says it cannot run (unschedulable, an image that
    cannot be had), in its own words, with a Warning event; False once it runs."""
    if launcher.waiting:
        message = f"{launcher.name}: {launcher.waiting}"
        d.set_cond("LauncherPending", "True", "LauncherPending", message, warn=True)
    elif st.is_true(d.status.conditions or [], "LauncherPending"):
        d.set_cond("LauncherPending", "False", "LauncherRunning", f"{launcher.name} can run")


def cancel_scale(d: Draft, kind: str, name: str, m: Members) -> Members:
    """The running scaler was deleted: undo what it had not finished."""
    pods = list(d.status.scaler_pods or [])
    if kind == naming.SCALEOUT_KIND:
        m = m.without(*pods)
        what = f"its new workers are removed: {', '.join(pods)}"
    else:
        back = [
            p for p in pods if p in d.workers and not d.workers[p].gone_bad and p not in m.members
        ]
        m = m.adding(*back)
        what = f"its workers stay: {', '.join(back) or 'none left'}"
    message = f"{kind} {name} was deleted while it ran; {what}"
    d.set_cond(st.SCALING, "False", "ScaleCancelled", message)
    d.plan.tell(Event("Warning", "ScaleCancelled", message))
    return m


def describe_loss(pod: PodView | None) -> str:
    if pod is None:
        return "disappeared"
    if pod.leaving:
        return f"is about to be taken away ({pod.leaving})"
    if pod.deleting:
        return "is being deleted"
    detail = f", exit code {pod.exit_code}" if pod.exit_code is not None else ""
    reason = f" ({pod.reason}{detail})" if pod.reason or detail else ""
    return f"ended {pod.phase}{reason}"
