from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etoperator.api.models import JobSpec, parse_job
from etoperator.api.scalers import parse_scaler
from etoperator.api.statuses import JobStatus, ScalerStatus, scaler_status
from etoperator.planning import (
    BasicsView,
    JobInput,
    Plan,
    PodView,
    ScalerView,
    check_scale_in,
    plan_job,
    replaces,
    victims_by_count,
)
from etoperator.planning.lifecycle import plan_refused
from etoperator.planning.membership import JOIN_TOGETHER
from etoperator.planning.phases import MOVES
from etoperator.status import Condition
from localcluster.manifests import job, scalein, scaleout, torchrun_job

NOW = datetime(2026, 1, 1, 12, 0, 0)


def jspec(**kw: Any) -> JobSpec:
    b = job("j", **kw)
    b["metadata"].update(namespace="ns", uid="u")
    return parse_job(b)


def w(i: int, phase: str = "Running", ready: bool = True, **kw: Any) -> PodView:
    return PodView(name=f"j-worker-{i}", role="worker", index=i, phase=phase, ready=ready, **kw)


def launcher(phase: str = "Running", run: int = 0, **kw: Any) -> PodView:
    return PodView(
        name="j-launcher", role="launcher", phase=phase, ready=phase == "Running", run=run, **kw
    )


def running_status(
    members: list[int], hosts: list[int] | None = None, **extra: Any
) -> dict[str, Any]:
    hosts = members if hosts is None else hosts
    return {
        "phase": "Running",
        "restartCount": 0,
        "runStartIndex": 0,
        "targetWorkers": [f"j-worker-{i}" for i in members],
        "currentWorkers": [f"j-worker-{i}" for i in hosts],
        "lastWorkerIndex": max(members),
        "acceptedReplicas": len(members),
        "conditions": [
            {"type": "LauncherCreated", "status": "True", "reason": "x", "message": "x"}
        ],
        **extra,
    }


def cond_of(status: JobStatus, ctype: str) -> Condition:
    return next(c for c in status.conditions or [] if c["type"] == ctype)


def typed_scaler(kind: str, status: ScalerStatus | dict[str, Any] | None) -> ScalerStatus:
    return scaler_status(kind, status) if status is None or isinstance(status, dict) else status


def typed(status: JobStatus | dict[str, Any]) -> JobStatus:
    return status if isinstance(status, JobStatus) else JobStatus.from_dict(status)


def inp(
    spec: JobSpec,
    status: JobStatus | dict[str, Any],
    pods: list[PodView],
    scalers: list[ScalerView] | None = None,
    now: datetime = NOW,
    published: list[str] | None = None,
) -> JobInput:
    return JobInput(
        name="j",
        namespace="ns",
        generation=1,
        spec=spec,
        error=None,
        status=typed(status),
        pods=pods,
        scalers=scalers or [],
        now=now,
        published=published if published is not None else list(typed(status).current_workers or []),
    )


def scaler(
    manifest: dict[str, Any],
    status: ScalerStatus | dict[str, Any] | None = None,
    created: str = "2026-01-01T11:00:00Z",
) -> ScalerView:
    manifest["metadata"].update(namespace="ns", creationTimestamp=created)
    return ScalerView(
        kind=manifest["kind"],
        name=manifest["metadata"]["name"],
        created=created,
        spec=parse_scaler(manifest["kind"], manifest),
        status=typed_scaler(manifest["kind"], status),
        owned=True,
    )


# -- table-driven -----------------------------------------------------------------------------


def test_first_pass_creates_replicas_workers_and_nothing_else() -> None:
    plan = plan_job(inp(jspec(replicas=3), {}, []))
    assert plan.create_workers == [0, 1, 2] and not plan.create_launcher
    assert plan.status.phase == "Created"
    assert plan.status.target_workers == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert plan.hosts == [] and plan.events[0].reason == "TrainingJobCreated"


def test_launcher_only_when_all_ready() -> None:
    s = plan_job(inp(jspec(), {}, [])).status
    half = plan_job(inp(jspec(), s, [w(0), w(1, ready=False)]))
    assert not half.create_launcher and half.hosts == []
    full = plan_job(inp(jspec(), s, [w(0), w(1)]))
    assert full.create_launcher and full.hosts == ["j-worker-0", "j-worker-1"]


def test_the_launcher_waits_for_its_account_role_and_binding() -> None:
    """They are made off the pass; until the caches show them, the workers are ready and
    listed, the launcher is not made, and the job waits for their events."""
    s = plan_job(inp(jspec(), {}, [])).status
    unseen = BasicsView(launcher_ready=False)
    without = dataclasses.replace(inp(jspec(), s, [w(0), w(1)]), basics=unseen)
    plan = plan_job(without)
    assert not plan.create_launcher and plan.hosts == ["j-worker-0", "j-worker-1"]
    ready = cond_of(plan.status, "WorkersReady")
    assert ready["status"] == "True" and plan.requeue == 60.0
    later = plan_job(dataclasses.replace(without, status=plan.status, basics=BasicsView()))
    assert later.create_launcher


def test_a_jobs_missing_basics_are_made_first_and_an_ended_job_gets_none() -> None:
    """Its Secret and ConfigMap (deleted under it, or never made), the launcher's access and a
    Role an older operator made: planned on every pass that finds them so, even while the job
    is held (what is in their way is said, then made once it is gone)."""
    s = plan_job(inp(jspec(), {}, [])).status
    lost = BasicsView(
        secret=False, config_map=False, access=(("Role", "j-launcher"),), role_current=False
    )
    running = dataclasses.replace(inp(jspec(), s, [w(0), w(1)]), basics=lost)
    for held in (False, True):
        plan = plan_job(dataclasses.replace(running, hold=held))
        assert (plan.make_secret, plan.make_config_map, plan.update_role) == (True, True, True)
        assert plan.make_access == (("Role", "j-launcher"),)
    whole = plan_job(dataclasses.replace(running, basics=BasicsView()))
    assert not (whole.make_secret or whole.make_config_map or whole.make_access)
    ended = plan_job(dataclasses.replace(running, status=dataclasses.replace(s, phase="Succeeded")))
    assert not (ended.make_secret or ended.make_config_map or ended.make_access)


def blocked_of(status: JobStatus) -> Condition:
    return cond_of(status, "Blocked")


def test_a_refused_write_is_said_once_and_cleared_once_writes_pass() -> None:
    s = plan_job(inp(jspec(), {}, [])).status
    said = plan_refused(s, "the API server refused create Pod: forbidden", NOW)
    assert said is not None
    blocked = blocked_of(said)
    assert (blocked["status"], blocked["reason"]) == ("True", "APIRefused")
    assert "forbidden" in blocked["message"] and said.phase == s.phase
    assert plan_refused(said, "the API server refused create Pod: forbidden", NOW) is None
    still = plan_job(inp(jspec(), said, []))
    assert blocked_of(still.status)["status"] == "True"
    over = plan_job(dataclasses.replace(inp(jspec(), said, []), refusal_over=True))
    cleared = blocked_of(over.status)
    assert (cleared["status"], cleared["reason"]) == ("False", "Resolved")


@pytest.mark.parametrize(
    "policy,pod,expected",
    [
        ("Always", w(0, "Succeeded", exit_code=0), True),
        ("Never", w(0, "Failed", exit_code=1), False),
        ("OnFailure", w(0, "Failed", exit_code=1), True),
        ("OnFailure", w(0, "Succeeded", exit_code=0), False),
        ("ExitCode", w(0, "Failed", exit_code=1), False),
        ("ExitCode", w(0, "Failed", exit_code=137), True),
        ("ExitCode", None, True),
        ("ExitCode", w(0, deleting=True), True),
    ],
)
def test_replacement_policy(policy: str, pod: PodView | None, expected: bool) -> None:
    assert replaces(policy, pod) is expected


def test_lost_worker_leaves_hosts_at_once_and_is_replaced() -> None:
    spec = jspec(replicas=3, workerRestartPolicy="Always")
    plan = plan_job(
        inp(spec, running_status([0, 1, 2]), [w(0), w(1, "Failed", exit_code=1), w(2), launcher()])
    )
    assert plan.hosts == ["j-worker-0", "j-worker-2"]
    assert plan.delete_pods == ["j-worker-1"] and plan.create_workers == [3]
    assert plan.status.target_workers == ["j-worker-0", "j-worker-2", "j-worker-3"]


def test_launcher_gone_fails_or_recreates() -> None:
    pods = [w(0), w(1)]
    failed = plan_job(inp(jspec(), running_status([0, 1]), pods))
    assert failed.status.phase == "Failed" and not failed.create_launcher
    again = plan_job(inp(jspec(launcherRestartPolicy="Always"), running_status([0, 1]), pods))
    assert again.create_launcher and again.status.phase == "Running"


def test_restart_rebuilds_from_scratch() -> None:
    spec = jspec(restartPolicy="OnFailure", backoffLimit=2)
    plan = plan_job(
        inp(spec, running_status([0, 1]), [w(0), w(1), launcher("Failed", exit_code=3)])
    )
    assert plan.status.restart_count == 1 and plan.status.phase == "Created"
    assert plan.status.target_workers == ["j-worker-2", "j-worker-3"]
    assert plan.hosts == [] and sorted(plan.delete_pods) == [
        "j-launcher",
        "j-worker-0",
        "j-worker-1",
    ]
    nxt = plan_job(inp(spec, plan.status, [launcher("Failed", exit_code=3, deleting=True)]))
    assert nxt.create_workers == [2, 3] and not nxt.create_launcher


@pytest.mark.parametrize(
    "policy,deleted",
    [
        ("All", ["j-launcher", "j-worker-0", "j-worker-1"]),
        ("Running", ["j-worker-0", "j-worker-1"]),
        ("None", []),
    ],
)
def test_clean_pod_policy(policy: str, deleted: list[str]) -> None:
    plan = plan_job(
        inp(
            jspec(cleanPodPolicy=policy),
            running_status([0, 1]),
            [w(0), w(1), launcher("Succeeded", exit_code=0)],
        )
    )
    assert plan.status.phase == "Succeeded" and sorted(plan.delete_pods) == deleted


def test_scale_out_freezes_plan_then_admits_together() -> None:
    spec = jspec(maxReplicas=4)
    so = scaler(scaleout("grow", "j", 2))
    plan = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    frozen = plan.scaler_status[("ScaleOut", "grow")].to_dict()
    assert frozen["addPods"] == ["j-worker-2", "j-worker-3"] and frozen["phase"] == "Scaling"
    assert plan.status.current_scaler == "ScaleOut:ns/grow"
    assert plan.create_workers == [2, 3] and plan.status.phase == "Scaling"
    so2 = dataclasses.replace(so, status=scaler_status(so.kind, frozen))
    pods = [w(0), w(1), w(2), w(3, ready=False), launcher()]
    waiting = plan_job(inp(spec, plan.status, pods, [so2]))
    assert waiting.hosts == ["j-worker-0", "j-worker-1"]  # not one by one
    pods[3] = w(3)
    joined = plan_job(inp(spec, plan.status, pods, [so2]))
    assert joined.hosts == [f"j-worker-{i}" for i in range(4)]
    done = plan_job(inp(spec, joined.status, pods, [so2], published=joined.hosts))
    assert done.scaler_status[("ScaleOut", "grow")].phase == "ScaleSucceeded"
    assert done.spec_replicas == 4 and done.status.current_scaler == ""


def horovod(i: int, *peers: int, **kw: Any) -> PodView:
    """Worker i, Running and listed, with Horovod on it connected to workers `peers`."""
    connected = frozenset(f"10.0.0.{p}" for p in peers)
    return w(i, ip=f"10.0.0.{i}", busy=True, peers=connected, **kw)


def test_a_scale_out_succeeds_only_once_horovod_has_taken_its_workers_in() -> None:
    """Horovod resets to take new hosts in; a host-list change made before that reset is done
    is lost or reaches a worker still starting, so the next scale must not start before."""
    spec = jspec(maxReplicas=4)
    frozen = {"phase": "Scaling", "addPods": ["j-worker-2"], "startTime": "2026-01-01T11:59:50Z"}
    so = scaler(scaleout("grow", "j", 1), status=frozen)
    status = running_status([0, 1, 2], hosts=[0, 1, 2], currentScaler="ScaleOut:ns/grow")
    hosts = ["j-worker-0", "j-worker-1", "j-worker-2"]
    starting = [horovod(0, 1), horovod(1, 0), w(2, ip="10.0.0.2", busy=True, peers=frozenset())]
    wait = plan_job(inp(spec, status, [*starting, launcher()], [so], published=hosts))
    assert wait.scaler_status[so.kind_name].phase == "Scaling"
    (cond,) = [
        c
        for c in wait.scaler_status[so.kind_name].to_dict()["conditions"]
        if c["type"] == "Scaling"
    ]
    assert cond["reason"] == "WaitingForHorovod" and "j-worker-2" in cond["message"]
    assert wait.status.current_scaler == "ScaleOut:ns/grow"  # no next scale may start
    assert wait.hosts == hosts  # listed meanwhile: that is how Horovod finds it
    half = [horovod(0, 1, 2), horovod(1, 0, 2), horovod(2, 0)]  # rendezvous under way
    assert (
        plan_job(inp(spec, status, [*half, launcher()], [so], published=hosts))
        .scaler_status[so.kind_name]
        .phase
        == "Scaling"
    )
    joined = [horovod(0, 1, 2), horovod(1, 0, 2), horovod(2, 0, 1)]
    done = plan_job(inp(spec, status, [*joined, launcher()], [so], published=hosts))
    assert done.scaler_status[so.kind_name].phase == "ScaleSucceeded"
    assert done.status.current_scaler == ""
    # A launcher that runs no Horovod (the first host has no Horovod process): nothing to wait for.
    idle = [w(0, ip="10.0.0.0", busy=False), w(1), w(2)]
    plain = plan_job(inp(spec, status, [*idle, launcher()], [so], published=hosts))
    assert plain.scaler_status[so.kind_name].phase == "ScaleSucceeded"
    # Horovod never started on it within the timeout (its --max-np reached): rolled back.
    late = NOW + timedelta(seconds=60)
    never = [horovod(0, 1), horovod(1, 0), w(2, ip="10.0.0.2", busy=False)]
    gave_up = plan_job(inp(spec, status, [*never, launcher()], [so], now=late, published=hosts))
    failed = gave_up.scaler_status[so.kind_name].to_dict()
    assert failed["phase"] == "ScaleFailed" and gave_up.delete_pods == ["j-worker-2"]
    assert "Horovod did not take j-worker-2 in" in str(failed["conditions"])


def test_a_scale_out_past_its_timeout_leaves_a_rendezvous_under_way_alone() -> None:
    """Horovod has started on the new worker and the others wait for it in their rendezvous:
    removed then, the rendezvous fails and the job with it. The scale waits on while the
    rendezvous may, then rolls back."""
    spec = jspec(maxReplicas=4)
    frozen = {"phase": "Scaling", "addPods": ["j-worker-2"], "startTime": "2026-01-01T11:59:50Z"}
    so = scaler(scaleout("grow", "j", 1), status=frozen)  # its timeout: 60 s
    status = running_status([0, 1, 2], hosts=[0, 1, 2], currentScaler="ScaleOut:ns/grow")
    hosts = ["j-worker-0", "j-worker-1", "j-worker-2"]
    starting = [horovod(0, 1), horovod(1, 0), w(2, ip="10.0.0.2", busy=True, peers=frozenset())]

    def at(seconds: int) -> Plan:
        now = NOW + timedelta(seconds=seconds)
        return plan_job(inp(spec, status, [*starting, launcher()], [so], now=now, published=hosts))

    waits = at(60)
    assert waits.scaler_status[so.kind_name].phase == "Scaling" and waits.delete_pods == []
    said = str(waits.scaler_status[so.kind_name].conditions)
    assert "Horovod is starting on j-worker-2, past the 60s timeout" in said
    rendezvous = spec.launcher.rendezvous_timeout
    gave_up = at(60 + rendezvous)
    assert gave_up.scaler_status[so.kind_name].phase == "ScaleFailed"
    assert gave_up.delete_pods == ["j-worker-2"]
    assert f"and its {rendezvous}s rendezvous" in str(gave_up.scaler_status[so.kind_name])


def test_scale_out_timeout_rolls_back() -> None:
    so = scaler(scaleout("grow", "j", 1, timeout=10))
    first = plan_job(inp(jspec(), running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    so2 = dataclasses.replace(so, status=first.scaler_status[so.kind_name])
    later = plan_job(
        inp(
            jspec(),
            first.status,
            [w(0), w(1), w(2, "Pending", False), launcher()],
            [so2],
            now=NOW + timedelta(seconds=11),
        )
    )
    assert later.scaler_status[so.kind_name].phase == "ScaleFailed"
    assert later.delete_pods == ["j-worker-2"]
    assert later.status.target_workers == ["j-worker-0", "j-worker-1"]


@given(n=st.integers(1, 12), count=st.integers(1, 12))
def test_victims_by_count_takes_highest(n: int, count: int) -> None:
    members = [f"j-worker-{i}" for i in range(n)]
    victims = victims_by_count("j", members, count)
    assert len(victims) == min(n, count)
    assert all(int(v.rsplit("-", 1)[1]) >= n - count for v in victims)


@given(n=st.integers(1, 12), count=st.integers(1, 12), minimum=st.integers(1, 12))
def test_scale_in_never_below_min_nor_empties_hosts(n: int, count: int, minimum: int) -> None:
    spec = jspec(replicas=max(n, minimum), minReplicas=minimum)
    members = [f"j-worker-{i}" for i in range(n)]
    victims, problem = check_scale_in(
        spec, members, members, parse_scaler("ScaleIn", scalein("s", "j", count=count))
    )
    if problem:
        assert victims == []
    else:
        assert n - len(victims) >= minimum and len(victims) < n


@given(
    names=st.lists(
        st.sampled_from([f"j-worker-{i}" for i in range(12)]), min_size=1, max_size=4, unique=True
    )
)
def test_scale_in_by_names_all_or_nothing(names: list[str]) -> None:
    members = [f"j-worker-{i}" for i in range(8)]
    victims, problem = check_scale_in(
        jspec(replicas=8),
        members,
        members,
        parse_scaler("ScaleIn", scalein("s", "j", pod_names=names)),
    )
    if any(n not in members for n in names):
        assert problem and "nothing deleted" in problem and victims == []
    elif not problem:
        assert sorted(victims) == sorted(names)


# -- property: any observed world -> a consistent, deterministic plan ------------------------

PHASES = ["Pending", "Running", "Succeeded", "Failed"]


@st.composite
def worlds(draw: st.DrawFn) -> JobInput:
    n = draw(st.integers(1, 5))
    policy = draw(st.sampled_from(["Always", "OnFailure", "Never", "ExitCode"]))
    spec = jspec(replicas=n, workerRestartPolicy=policy, maxReplicas=8)
    members = list(range(n))
    hosts = [i for i in members if draw(st.booleans())]
    pods = []
    for i in members:
        if draw(st.integers(0, 5)) == 0:
            continue  # deleted under us
        phase = draw(st.sampled_from(PHASES))
        if i in hosts and phase == "Pending":
            phase = "Running"  # a host was ready once; pods never go back to Pending
        pods.append(
            w(
                i,
                phase,
                ready=phase == "Running" and draw(st.booleans()),
                exit_code=draw(st.sampled_from([None, 0, 1, 137])),
                deleting=draw(st.integers(0, 6)) == 0,
            )
        )
    pods.append(launcher(draw(st.sampled_from(["Running", "Running", "Failed", "Succeeded"]))))
    scalers = []
    if draw(st.booleans()):
        scalers.append(scaler(scaleout("a", "j", draw(st.integers(1, 3)))))
    if draw(st.booleans()):
        scalers.append(scaler(scalein("b", "j", count=1), created="2026-01-01T11:00:01Z"))
    return inp(spec, running_status(members, hosts), pods, scalers)


@settings(max_examples=300, deadline=None)
@given(world=worlds())
def test_plan_is_deterministic_and_consistent(world: JobInput) -> None:
    plan = plan_job(world)
    assert plan == plan_job(world)  # planning twice gives the same plan
    existing = {p.index for p in world.pods if p.index is not None}
    # Never reuse a name while a pod of that name exists.
    assert not set(plan.create_workers) & existing
    assert not {f"j-worker-{i}" for i in plan.create_workers} & set(plan.delete_pods)
    hosts = plan.status.current_workers or []
    if plan.status.phase in ("Succeeded", "Failed"):
        return  # the host list of a finished job is history
    by_name = {p.name: p for p in world.pods}
    for h in hosts:  # every host is a live member
        assert h in (plan.status.target_workers or [])
        pod = by_name.get(h)
        assert pod is not None and not pod.gone_bad and h not in plan.delete_pods
    # At most one scaler runs.
    running = [k for k, s in plan.scaler_status.items() if s.phase == "Scaling"]
    assert len(running) <= 1


def test_invalid_spec_fails_then_starts_once_fixed() -> None:
    bad = JobInput(
        name="j",
        namespace="ns",
        generation=1,
        spec=None,
        error="spec.x is wrong",
        status=JobStatus.from_dict({}),
        pods=[],
        scalers=[],
        now=NOW,
    )
    failed = plan_job(bad)
    assert failed.status.phase == "Failed" and not failed.create_workers
    assert failed.events[0].type == "Warning" and failed.events[0].reason == "InvalidSpec"
    fixed = plan_job(inp(jspec(replicas=2), failed.status, []))
    assert fixed.status.phase == "Created" and fixed.create_workers == [0, 1]


def test_kubectl_scale_during_a_scale_is_not_lost() -> None:
    # `kubectl scale` asked for 5 while a ScaleOut to 3 ran (accepted is still 3).
    spec = jspec(replicas=5, maxReplicas=8)
    so = scaler(scaleout("j-replicas-2", "j", 1))
    first = plan_job(
        inp(
            jspec(replicas=3, maxReplicas=8),
            running_status([0, 1], acceptedReplicas=3),
            [w(0), w(1), launcher()],
            [so],
        )
    )
    so = dataclasses.replace(so, status=first.scaler_status[so.kind_name])
    pods = [w(0), w(1), w(2), launcher()]
    joined = plan_job(inp(spec, first.status, pods, [so]))
    done = plan_job(inp(spec, joined.status, pods, [so], published=joined.hosts))
    assert done.scaler_status[so.kind_name].phase == "ScaleSucceeded"
    assert done.spec_replicas is None  # the user's 5 is kept, not overwritten with 3
    (follow_up,) = done.create_scalers
    assert follow_up["kind"] == "ScaleOut" and follow_up["spec"]["toAdd"] == {"count": 2}
    # Taken once its scaler is seen: a crash before the create lands leaves the request standing.
    assert done.status.accepted_replicas == 3
    made = scaler(scaleout(follow_up["name"], "j", 2), created="2026-01-01T11:30:00Z")
    made = dataclasses.replace(made, made_for=follow_up["generation"])
    so = dataclasses.replace(so, status=done.scaler_status[so.kind_name])
    taken = plan_job(inp(spec, done.status, pods, [so, made], published=joined.hosts))
    assert taken.status.accepted_replicas == 5 and not taken.create_scalers


def test_scale_out_onto_a_name_someone_else_holds_fails_at_once() -> None:
    so = scaler(scaleout("grow", "j", 2))
    first = plan_job(inp(jspec(), running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    so = dataclasses.replace(so, status=first.scaler_status[so.kind_name])
    world = inp(jspec(), first.status, [w(0), w(1), w(3), launcher()], [so])
    plan = plan_job(dataclasses.replace(world, squatted=("j-worker-2",)))
    st = plan.scaler_status[so.kind_name].to_dict()
    assert st["phase"] == "ScaleFailed"
    message = st["conditions"][-1]["message"]
    assert "j-worker-2 exists and is not this job's" in message and "removed j-worker-3" in message
    assert plan.delete_pods == ["j-worker-3"] and not plan.create_workers
    assert plan.status.target_workers == ["j-worker-0", "j-worker-1"]


def test_one_worker_is_spoken_of_in_the_singular() -> None:
    plan = plan_job(inp(jspec(replicas=1), running_status([0], conditions=[]), [w(0)]))
    ready = cond_of(plan.status, "WorkersReady")
    assert ready["message"] == "1 worker accepts the job's SSH key"


def test_a_scale_that_succeeded_stays_succeeded_when_the_job_ends() -> None:
    """A ScaleIn finishing in the pass where the launcher succeeds ends ScaleSucceeded, and a
    later pass that still sees it Scaling (a cache behind our write) never rewrites its end."""
    spec = jspec(minReplicas=1)
    si = scaler(scalein("shrink", "j", count=1))
    start = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [si]))
    si = dataclasses.replace(si, status=start.scaler_status[si.kind_name])
    pods = [w(0), w(1, busy=False), launcher("Succeeded")]
    end = plan_job(inp(spec, start.status, pods, [si], published=["j-worker-0"]))
    assert end.status.phase == "Succeeded"
    assert end.scaler_status[si.kind_name].phase == "ScaleSucceeded"
    failed = [
        c for c in end.scaler_status[si.kind_name].conditions or [] if c["type"] == "ScaleFailed"
    ]
    assert failed == []
    # The next pass, its cache still showing the scaler as it was before our write.
    again = plan_job(inp(spec, end.status, pods, [si], published=["j-worker-0"]))
    assert si.kind_name not in again.scaler_status or again.scaler_status[si.kind_name].phase in (
        None,
        "ScaleSucceeded",
    )


def test_suspended_mid_scale_out_gives_back_the_size_before_it() -> None:
    """The ScaleOut ends JobSuspended, and spec replicas (raised to its target while it ran)
    return to the size before it, so that resuming starts the job at that size."""
    spec = jspec(maxReplicas=4)
    so = scaler(scaleout("grow", "j", 2))
    start = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    assert start.spec_replicas == 4  # the target, shown while it runs
    so = dataclasses.replace(so, status=start.scaler_status[so.kind_name])
    b = job("j", maxReplicas=4, replicas=4)
    b["metadata"].update(
        namespace="ns", uid="u", annotations={"job-supervisor.kube-ai.io/job-suspended": "true"}
    )
    suspended = parse_job(b)
    pods = [w(0), w(1), w(2, "Pending", False), w(3, "Pending", False), launcher()]
    plan = plan_job(inp(suspended, start.status, pods, [so]))
    assert plan.status.phase == "Suspended"
    assert plan.scaler_status[so.kind_name].phase == "ScaleFailed"
    assert plan.spec_replicas == 2


def test_workers_ready_says_how_many_there_are_now_without_a_new_event() -> None:
    """After a scale, WorkersReady tells the current count (not the count the launcher started
    with), and a changed count is no new WorkersReady event."""
    status = running_status([0, 1])
    status["conditions"].append(
        {"type": "WorkersReady", "status": "True", "reason": "WorkersReady",
         "message": "4 workers accept the job's SSH key"}
    )  # fmt: skip
    plan = plan_job(inp(jspec(), status, [w(0), w(1), launcher()]))
    cond = cond_of(plan.status, "WorkersReady")
    assert cond["message"] == "2 workers accept the job's SSH key"
    assert [e for e in plan.events if e.reason == "WorkersReady"] == []


def test_a_script_that_outlives_the_timeout_never_undoes_the_scale_out() -> None:
    """The new workers are in the host list Horovod reads: the scale happened. A script still
    running past the scaler's timeout is waited for (its own run is bounded by that timeout)
    and its outcome is reported, never a rollback with an empty list of laggards."""
    spec = jspec(maxReplicas=3)
    manifest = scaleout("grow", "j", 1, timeout=10)
    manifest["spec"]["script"] = "/hooks/slow.sh"
    so = scaler(manifest)
    first = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    so = dataclasses.replace(so, status=first.scaler_status[so.kind_name])
    pods = [w(0), w(1), w(2), launcher()]
    joined = plan_job(inp(spec, first.status, pods, [so]))
    hosts = joined.hosts
    later = plan_job(
        inp(spec, joined.status, pods, [so], now=NOW + timedelta(seconds=30), published=hosts)
    )
    assert later.scaler_status.get(so.kind_name, so.status).phase == "Scaling"
    assert later.delete_pods == [] and later.run_scripts, later
    reported = dict(so.status.to_dict(), conditions=[*(so.status.conditions or []), {
        "type": "ScriptExecuted", "status": "False", "reason": "ScriptFailed",
        "message": "script exited 124 on j-launcher"}])  # fmt: skip
    so = dataclasses.replace(so, status=scaler_status(so.kind, reported))
    done = plan_job(
        inp(spec, later.status, pods, [so], now=NOW + timedelta(seconds=31), published=hosts)
    )
    assert done.scaler_status[so.kind_name].phase == "ScaleSucceeded"


def test_workers_that_cannot_run_are_said_on_the_job() -> None:
    """A worker the scheduler cannot place (or whose image cannot be had) leaves the job
    waiting: the job says which and why, in the pod's own words, with a Warning event."""
    spec = jspec()
    first = plan_job(inp(spec, {}, []))
    why = "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."
    pods = [w(0), w(1, "Pending", False, waiting=why)]
    plan = plan_job(inp(spec, first.status, pods))
    cond = cond_of(plan.status, "WorkersPending")
    assert cond["status"] == "True" and "j-worker-1" in cond["message"] and why in cond["message"]
    assert [e.type for e in plan.events if e.reason == "WorkersPending"] == ["Warning"]
    placed = plan_job(inp(spec, plan.status, [w(0), w(1)]))
    cond = cond_of(placed.status, "WorkersPending")
    assert cond["status"] == "False"


def test_a_launcher_that_cannot_run_is_said_on_the_job() -> None:
    """A launcher whose image cannot be had left the job Created, LauncherCreated=True, with no
    word of why (a worker's was said within seconds)."""
    spec = jspec()
    first = plan_job(inp(spec, {}, []))
    made = plan_job(inp(spec, first.status, [w(0), w(1)]))
    assert made.create_launcher
    why = 'ErrImageNeverPull: Container image "nope:latest" is not present'
    stuck = launcher("Pending", waiting=why)
    plan = plan_job(inp(spec, made.status, [w(0), w(1), stuck]))
    cond = cond_of(plan.status, "LauncherPending")
    assert cond["status"] == "True" and "j-launcher" in cond["message"] and why in cond["message"]
    assert [e.type for e in plan.events if e.reason == "LauncherPending"] == ["Warning"]
    assert plan.status.phase == "Created"
    ran = plan_job(inp(spec, plan.status, [w(0), w(1), launcher()]))
    cond = cond_of(ran.status, "LauncherPending")
    assert cond["status"] == "False" and ran.status.phase == "Running"


def test_a_scale_in_that_waits_says_for_what() -> None:
    """A ScaleIn waiting on Horovod to leave its victims says so on the scaler (which pods,
    and until when), not in silence."""
    spec = jspec(minReplicas=1)
    si = scaler(scalein("shrink", "j", count=1))
    start = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [si]))
    si = dataclasses.replace(si, status=start.scaler_status[si.kind_name])
    pods = [w(0), w(1, busy=True), launcher()]
    plan = plan_job(inp(spec, start.status, pods, [si], published=["j-worker-0"]))
    cond = next(
        c for c in plan.scaler_status[si.kind_name].conditions or [] if c["type"] == "Scaling"
    )
    assert cond["reason"] == "Draining" and "j-worker-1" in cond["message"]
    assert "60s timeout" in cond["message"]


def _script_scale_out(
    started: str | None,
) -> tuple[JobSpec, JobStatus, ScalerView, list[PodView]]:
    """A ScaleOut whose new worker is in, its script marked as started at `started`."""
    spec = jspec(maxReplicas=3)
    manifest = scaleout("grow", "j", 1, timeout=20)
    manifest["spec"]["script"] = "/hooks/notify.sh"
    so = scaler(manifest)
    first = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    status = first.scaler_status[so.kind_name].to_dict()
    if started is not None:
        status["conditions"] = [*status["conditions"], {
            "type": "ScriptExecuted", "status": "Unknown", "reason": "ScriptRunning",
            "message": "started on j-launcher", "lastTransitionTime": started}]  # fmt: skip
    so = dataclasses.replace(so, status=scaler_status(so.kind, status))
    pods = [w(0), w(1), w(2), launcher()]
    joined = plan_job(inp(spec, first.status, pods, [so]))
    return spec, joined.status, so, pods


def test_a_script_marked_started_is_never_started_again() -> None:
    """After an operator restart the script marked as started may still run in the launcher,
    or have ended unseen: it is never started again; its end is asked of the launcher's
    record, said to be past its timeout once it is."""
    spec, status, so, pods = _script_scale_out("2026-01-01T12:00:00Z")
    hosts = status.current_workers
    early = plan_job(
        inp(spec, status, pods, [so], now=NOW + timedelta(seconds=10), published=hosts)
    )
    assert early.run_scripts == [] and [(k, over) for k, _, over in early.check_scripts] == [
        (so.kind_name, False)
    ]
    assert early.scaler_status.get(so.kind_name, so.status).phase == "Scaling"
    late = plan_job(inp(spec, status, pods, [so], now=NOW + timedelta(seconds=40), published=hosts))
    assert late.run_scripts == [] and [over for _, _, over in late.check_scripts] == [True]
    spec, status, so, pods = _script_scale_out(None)
    fresh = plan_job(inp(spec, status, pods, [so], published=status.current_workers))
    assert [key for key, *_ in fresh.run_scripts] == [so.kind_name]
    assert fresh.run_scripts[0][3] == early.check_scripts[0][1]  # one record for the scaler


def test_a_worker_whose_sshd_is_starting_is_probed_again_soon() -> None:
    """Running but not yet accepting the key (sshd starts after its container): the next pass
    comes within a fifth of a second, not a second, so a job or a ScaleOut waits no longer than
    sshd does. A Pending worker has nothing to probe: its watch events bring the next pass,
    no poll comes sooner than the resync (500 jobs waiting for nodes made 500 passes a second)."""
    spec = jspec()
    first = plan_job(inp(spec, {}, []))
    starting = plan_job(inp(spec, first.status, [w(0), w(1, ready=False)]))
    assert starting.requeue <= 0.2
    placed = w(1, "Pending", False, bound=True)  # its node pulls the image
    assert plan_job(inp(spec, first.status, [w(0), placed])).requeue == 60.0
    waits = w(1, "Pending", False, waiting="Unschedulable: 0/2 nodes are available")
    assert plan_job(inp(spec, first.status, [w(0), waits])).requeue == 60.0
    # No scheduler's word at all (a schedulerName naming none): looked at again to say so.
    unseen = plan_job(inp(spec, first.status, [w(0), w(1, "Pending", False)]))
    assert unseen.requeue <= 21
    launching = plan_job(inp(spec, first.status, [w(0), w(1), launcher("Pending")]))
    assert launching.requeue == 60.0


def test_the_launcher_of_the_run_before_a_suspension_is_not_the_resumed_runs() -> None:
    """Resumed, the job starts afresh while the launcher deleted at the suspension is still
    terminating (a real kubelet takes a moment): that launcher is not this run's, so it is
    neither "created" nor lost, and the new one comes once it is gone."""
    b = job("j")
    b["metadata"].update(
        namespace="ns", uid="u", annotations={"job-supervisor.kube-ai.io/job-suspended": "true"}
    )
    suspended = plan_job(inp(parse_job(b), running_status([0, 1]), [w(0), w(1), launcher()]))
    assert suspended.status.phase == "Suspended"
    old = launcher(deleting=True)
    resumed = plan_job(inp(jspec(), suspended.status, [old]))
    assert resumed.status.phase == "Created" and resumed.create_workers == [2, 3]
    assert not any(e.reason in ("LauncherLost", "LauncherCreated") for e in resumed.events)
    ready = plan_job(inp(jspec(), resumed.status, [w(2), w(3), old]))
    assert ready.status.phase == "Created" and not ready.create_launcher
    gone = plan_job(inp(jspec(), ready.status, [w(2), w(3)]))
    assert gone.create_launcher and gone.status.phase == "Created"


def test_a_finished_scaler_no_longer_says_it_is_scaling() -> None:
    """`kubectl describe` showed Scaling=True beside ScaleSucceeded or ScaleFailed."""
    spec = jspec(maxReplicas=4)
    so = scaler(scaleout("grow", "j", 1))
    first = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()], [so]))
    so2 = dataclasses.replace(so, status=first.scaler_status[so.kind_name])
    pods = [w(0), w(1), w(2), launcher()]
    joined = plan_job(inp(spec, first.status, pods, [so2]))
    done = plan_job(inp(spec, joined.status, pods, [so2], published=joined.hosts))
    ended = done.scaler_status[so.kind_name].to_dict()
    conds = {c["type"]: c for c in ended["conditions"]}
    assert ended["phase"] == "ScaleSucceeded" and conds["ScaleSucceeded"]["status"] == "True"
    assert conds["Scaling"]["status"] == "False" and conds["Scaling"]["reason"] == "ScaleSucceeded"
    late = NOW + timedelta(seconds=120)
    failed = plan_job(inp(spec, first.status, [w(0), w(1), launcher()], [so2], now=late))
    conds = {c["type"]: c for c in failed.scaler_status[so.kind_name].conditions or []}
    assert conds["ScaleFailed"]["status"] == "True" and conds["Scaling"]["status"] == "False"


def test_names_in_the_status_that_are_not_this_jobs_workers_are_dropped_and_said() -> None:
    """Someone with status-write rights named another job's pod in targetWorkers: it was kept
    (after a ScaleOut spec.replicas was 4 with 3 workers). It is dropped, with a Warning."""
    spec = jspec(maxReplicas=4)
    forged = running_status([0, 1])
    forged["targetWorkers"] = ["j-worker-0", "j-worker-1", "other-worker-0"]
    forged["currentWorkers"] = ["j-worker-0", "other-worker-0", "j-worker-1"]
    plan = plan_job(inp(spec, forged, [w(0), w(1), launcher()]))
    assert plan.status.target_workers == ["j-worker-0", "j-worker-1"]
    assert plan.status.current_workers == ["j-worker-0", "j-worker-1"]
    assert plan.hosts == ["j-worker-0", "j-worker-1"]
    (said,) = [e for e in plan.events if e.reason == "StatusRepaired"]
    assert said.type == "Warning" and "other-worker-0" in said.message
    assert plan.spec_replicas is None  # nothing to follow: two workers, as asked
    so = scaler(scaleout("grow", "j", 1))
    grown = plan_job(inp(spec, forged, [w(0), w(1), launcher()], [so]))
    assert grown.status.target_workers == ["j-worker-0", "j-worker-1", "j-worker-2"]


def invalid(status: JobStatus | dict[str, Any], pods: list[PodView] | None = None) -> JobInput:
    """The job's input once its spec was edited into one the operator refuses."""
    valid = inp(jspec(replicas=2), status, pods or [])
    return dataclasses.replace(valid, spec=None, error="spec.x is wrong")


@pytest.mark.parametrize("ended", ["Succeeded", "Failed"])
def test_an_ended_job_keeps_its_end_when_its_spec_turns_invalid_and_back(ended: str) -> None:
    """A job's end is its last word: a spec made invalid after it did not make a Succeeded
    job Failed, nor a job that failed for its launcher one refused for its spec, which a fix
    of the spec then started again from nothing."""
    reason = "Succeeded" if ended == "Succeeded" else "LauncherFailed"
    done = running_status([0, 1], phase=ended, completionTime="2026-01-01T11:00:00Z")
    done["conditions"].append({"type": ended, "status": "True", "reason": reason, "message": "x"})
    refused = plan_job(invalid(typed(done)))
    assert refused.status.phase == ended and cond_of(refused.status, ended)["reason"] == reason
    assert refused.status.completion_time == "2026-01-01T11:00:00Z"
    assert not refused.events  # an ended job's spec is not acted upon, valid or not
    fixed = plan_job(inp(jspec(replicas=2), refused.status, []))
    assert fixed.status.phase == ended and not fixed.create_workers and not fixed.create_launcher


@settings(max_examples=400, deadline=None)
@given(
    world=worlds(),
    was=st.sampled_from([None, *MOVES]),
    why=st.sampled_from(["InvalidSpec", "LauncherFailed"]),
    suspended=st.booleans(),
    invalid_now=st.integers(0, 4),
)
def test_every_phase_move_is_one_the_table_has(
    world: JobInput, was: str | None, why: str, suspended: bool, invalid_now: int
) -> None:
    """Whatever a pass sees, the phase it writes is the one it read or a move `MOVES` lists;
    a Failed job moves on only when it was refused for its spec."""
    status = dataclasses.replace(world.status, phase=was)
    if was == "Failed":
        status.conditions = [{"type": "Failed", "status": "True", "reason": why, "message": "x"}]
    assert world.spec is not None
    spec = dataclasses.replace(world.spec, suspended=suspended)
    world = dataclasses.replace(world, status=status, spec=spec)
    if invalid_now == 0:
        world = dataclasses.replace(world, spec=None, error="spec.x is wrong")
    now = plan_job(world).status.phase
    assert now == was or now in MOVES[was], f"{was} -> {now}"
    if was == "Failed" and now != "Failed":
        assert why == "InvalidSpec" and world.spec is not None


def test_a_probe_that_cannot_tell_never_rolls_back_nor_ends_a_scale_out() -> None:
    """Under load a worker's probe over SSH may not answer in time. Past its timeout, a
    ScaleOut whose new worker could not be asked waits on as for one seen starting (it rolled
    back and deleted a worker Horovod was starting on: the others' rendezvous failed, and the
    job with it); one whose earlier hosts could not be asked does not take "no Horovod here"
    for an answer and succeed before Horovod took the worker in."""
    spec = jspec(maxReplicas=4)
    frozen = {"phase": "Scaling", "addPods": ["j-worker-2"], "startTime": "2026-01-01T11:59:50Z"}
    so = scaler(scaleout("grow", "j", 1), status=frozen)  # its timeout: 60 s
    status = running_status([0, 1, 2], hosts=[0, 1, 2], currentScaler="ScaleOut:ns/grow")
    hosts = ["j-worker-0", "j-worker-1", "j-worker-2"]
    unasked = w(2, ip="10.0.0.2", horovod_unknown=True)
    late = NOW + timedelta(seconds=60)
    pods = [horovod(0, 1), horovod(1, 0), unasked, launcher()]
    waits = plan_job(inp(spec, status, pods, [so], now=late, published=hosts))
    assert waits.scaler_status[so.kind_name].phase == "Scaling" and waits.delete_pods == []
    assert "cannot be asked" in str(waits.scaler_status[so.kind_name].conditions)
    before = [w(0, ip="10.0.0.0", horovod_unknown=True), w(1, ip="10.0.0.1", busy=False)]
    pods = [*before, w(2, ip="10.0.0.2", busy=False), launcher()]
    early = plan_job(inp(spec, status, pods, [so], published=hosts))
    assert early.scaler_status[so.kind_name].phase == "Scaling"
    assert early.status.current_scaler == "ScaleOut:ns/grow"


def test_an_invalid_edit_of_a_running_job_is_refused_and_the_job_runs_on() -> None:
    """A spec edited into one only the operator refuses (a reserved mount path, a root
    launcher) made a running job Failed, its pods left running; fixing it then started a
    fresh run. The edit is refused, said once, and the job runs on as it was until fixed."""
    status = running_status([0, 1])
    pods = [w(0), w(1), launcher()]
    edited = invalid(status, pods)
    held = plan_job(edited)
    assert held.status.phase == "Running" and held.status.completion_time is None
    cond = cond_of(held.status, "Blocked")
    assert cond["status"] == "True" and cond["reason"] == "InvalidSpec", cond
    assert "spec.x is wrong" in cond["message"] and "runs on as it was" in cond["message"]
    assert not held.delete_pods and not held.create_workers and not held.create_launcher
    assert held.status.target_workers == ["j-worker-0", "j-worker-1"]
    assert [e.reason for e in held.events] == ["InvalidSpec"]
    again = plan_job(dataclasses.replace(edited, status=held.status))
    assert again.events == [] and again.status.phase == "Running"  # said once
    fixed = plan_job(inp(jspec(), again.status, pods))
    assert fixed.status.phase == "Running" and cond_of(fixed.status, "Blocked")["status"] == "False"
    assert not fixed.create_workers and not fixed.delete_pods  # the same run goes on


def test_a_lost_worker_never_edits_the_spec_below_its_gang() -> None:
    """Not replaced, a lost worker lowers spec replicas to the members left, never below the
    gang's minAvailable: the operator never writes a spec it would refuse (a refused edit
    holds the job, its launcher's end included)."""
    spec = jspec(replicas=2, workerRestartPolicy="Never", schedulingPolicy={"minAvailable": 2})
    plan = plan_job(
        inp(spec, running_status([0, 1]), [w(0), w(1, "Failed", exit_code=1), launcher()])
    )
    assert plan.hosts == ["j-worker-0"]
    assert plan.spec_replicas is None and plan.status.accepted_replicas == 2


def test_a_torchrun_worker_whose_agent_finished_is_no_loss() -> None:
    """torchrun's agents exit 0 once the run's work is done (its exit barrier passed): the run
    ends with its launcher, not with a WorkerLost and a smaller job."""
    b = torchrun_job("j", 2, ["--steps", "5"])
    b["metadata"].update(namespace="ns", uid="u")
    spec = parse_job(b)
    pods = [w(0, "Succeeded", exit_code=0), w(1), launcher()]
    plan = plan_job(inp(spec, running_status([0, 1]), pods))
    assert plan.hosts == ["j-worker-0", "j-worker-1"] and not plan.delete_pods
    assert plan.spec_replicas is None
    assert not [e for e in plan.events if e.reason == "WorkerLost"]
    done = plan_job(
        inp(
            spec,
            plan.status,
            [
                w(0, "Succeeded", exit_code=0),
                w(1, "Succeeded", exit_code=0),
                launcher("Succeeded", exit_code=0),
            ],
        )
    )
    assert done.status.phase == "Succeeded"


def test_new_workers_join_the_host_list_together() -> None:
    """Workers joining a running job outside a ScaleOut (Kueue admitted more, replacements)
    enter the host list in one change: each change is a reset of Horovod's ranks, and one made
    while they reset for the previous one (a worker still starting) is dropped by them at
    their reset, so the job never grows to it (seen: the second of two workers ready a second
    apart listed and never taken in). A ready one waits for the others while they start, up
    to JOIN_TOGETHER seconds; one that cannot start (unplaced, failing) holds no one back."""
    spec = jspec(replicas=4, workerRestartPolicy="OnFailure")
    status = running_status([0, 1, 2, 3], hosts=[0, 1])
    starting = w(3, ready=False, bound=True, age=5.0)
    plan = plan_job(inp(spec, status, [w(0), w(1), w(2, age=5.0), starting, launcher()]))
    assert plan.hosts == ["j-worker-0", "j-worker-1"]
    both = plan_job(inp(spec, status, [w(0), w(1), w(2, age=6.0), w(3, age=6.0), launcher()]))
    assert both.hosts == [f"j-worker-{i}" for i in range(4)]
    for stuck in (
        w(3, ready=False, bound=True, age=JOIN_TOGETHER + 1),
        w(3, "Pending", ready=False, bound=False, age=5.0),
        w(3, "Failed", ready=False, bound=True, age=5.0, exit_code=1),
    ):
        alone = plan_job(inp(spec, status, [w(0), w(1), w(2, age=40.0), stuck, launcher()]))
        assert alone.hosts == ["j-worker-0", "j-worker-1", "j-worker-2"], stuck


def suspended(body: dict[str, Any]) -> JobSpec:
    body["metadata"].update(
        namespace="ns", uid="u", annotations={"job-supervisor.kube-ai.io/job-suspended": "true"}
    )
    return parse_job(body)


def test_a_whole_stop_of_a_horovod_run_stops_its_launcher_first_then_its_workers_at_once() -> None:
    """Suspended (or evicted whole): the launcher goes first, its preStop asking the training to
    save; its running workers only once it is gone, and then at once. Deleted with it, each
    worker's preStop waited for Horovod to leave it, which a run saved for its stop never does
    (rank 0 holds after its save): every whole stop took the workers' 30 s grace period."""
    spec = suspended(job("j", sharedVolume={"storage": "1Gi"}))
    pods = [w(0), w(1), w(2, "Pending", False), launcher(deleting=False)]
    first = plan_job(inp(spec, running_status([0, 1, 2]), pods))
    assert first.status.phase == "Suspended"
    assert sorted(first.delete_pods) == ["j-launcher", "j-worker-2"]
    saving = plan_job(inp(spec, first.status, [w(0), w(1), launcher(deleting=True)]))
    assert saving.delete_pods == []
    gone = plan_job(inp(spec, first.status, [w(0), w(1)]))
    assert gone.delete_pods == ["j-worker-0", "j-worker-1"] == gone.stop_now


def test_a_whole_stop_of_a_torchrun_run_stops_every_pod_together_its_launcher_first() -> None:
    """torchrun's workers save at their own SIGTERM and meet at the launcher's rendezvous: all
    go together, each with its grace period to save in. The launcher's delete is written
    first: a worker's leave that comes before the launcher's preStop finds it deleting."""
    spec = suspended(torchrun_job("j", 2, ["--steps", "5"]))
    plan = plan_job(inp(spec, running_status([0, 1]), [w(0), w(1), launcher()]))
    assert plan.delete_pods == ["j-launcher", "j-worker-0", "j-worker-1"]
    assert plan.stop_now == []


def test_a_running_scale_out_s_new_worker_holds_back_no_replacement() -> None:
    """A ScaleOut's worker joins on the scale's terms (all of its workers at once): a
    replacement made meanwhile joins the host list when ready, not held for it."""
    spec = jspec(replicas=3, maxReplicas=4, workerRestartPolicy="Always")
    frozen = {"phase": "Scaling", "addPods": ["j-worker-2"], "startTime": "2026-01-01T11:59:50Z"}
    so = scaler(scaleout("grow", "j", 1), status=frozen)
    status = running_status([1, 2, 3], hosts=[1], currentScaler="ScaleOut:ns/grow")
    pods = [w(1), w(2, ready=False, bound=True, age=5.0), w(3, age=5.0), launcher()]
    plan = plan_job(inp(spec, status, pods, [so], published=["j-worker-1"]))
    assert plan.hosts == ["j-worker-1", "j-worker-3"]
