"""spec replicas (what `kubectl scale` sets) against crashes: a small world applies each plan's
writes in the reconciler's order and may stop after any one of them, as a SIGKILL would."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from etoperator.api.statuses import JobStatus, ScalerStatus
from etoperator.planning import JobInput, PodView, ScalerView, plan_job
from etoperator.planning.kinds import (
    DeletePod,
    HostList,
    JobStatusWrite,
    MakeScaler,
    ScalerStatusWrite,
    SpecReplicas,
    WorkerObjects,
    Write,
)
from etoperator.planning.plan import Plan
from etoperator.planning.writes import Queueing, ordered
from localcluster.manifests import scalein, scaleout
from tests.unit.test_planning import NOW, jspec, launcher, running_status, scaler, w


class Crashed(Exception):
    pass


@dataclass
class World:
    replicas: int
    status: JobStatus
    pods: dict[str, PodView]
    scalers: dict[tuple[str, str], ScalerView]
    published: list[str]
    generation: int = 1
    max_replicas: int = 8
    writes: int = 0
    crash_at: int | None = None
    made: list[str] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # pods that never become ready
    tick: int = 0
    plan: Plan = field(default_factory=lambda: Plan(status=JobStatus()))  # the pass's

    def write(self, fn: Callable[..., object], *args: Any) -> None:
        fn(*args)
        self.writes += 1
        if self.crash_at is not None and self.writes == self.crash_at:
            raise Crashed

    def set_replicas(self, n: int) -> None:
        if n != self.replicas:
            self.replicas, self.generation = n, self.generation + 1

    def observe(self) -> JobInput:
        return JobInput(
            name="j",
            namespace="ns",
            generation=self.generation,
            spec=jspec(replicas=self.replicas, maxReplicas=self.max_replicas),
            error=None,
            status=self.status,
            pods=[*self.pods.values(), launcher()],
            scalers=list(self.scalers.values()),
            now=NOW + timedelta(seconds=self.tick),
            published=self.published,
        )

    def queueing(self) -> Queueing | None:
        return None

    def act(self) -> float:
        """One pass: the plan's writes in their one order (planning/writes.py, as the
        reconciler runs them), each a step a crash can end the pass after."""
        self.plan = plan_job(self.observe())
        for write in ordered(self.plan, pods=True, queue=self.queueing()):
            self.apply(write)
        return self.plan.requeue

    def apply(self, write: Write) -> None:
        if isinstance(write, ScalerStatusWrite):
            self.write(self._set_scaler, write.kind_name, write.status)
        elif isinstance(write, JobStatusWrite):
            self.write(setattr, self, "status", write.status)
        elif isinstance(write, SpecReplicas):
            self.write(self.set_replicas, write.replicas)
        elif isinstance(write, HostList) and list(write.hosts) != self.published:
            self.write(setattr, self, "published", list(write.hosts))
        elif isinstance(write, DeletePod):
            self.write(self.pods.pop, write.name)
        elif isinstance(write, WorkerObjects):
            for i in write.indices:
                self.write(self._start, i)
        elif isinstance(write, MakeScaler):
            self.write(self._make, write.wanted)

    def _set_scaler(self, key: tuple[str, str], status: ScalerStatus) -> None:
        self.scalers[key] = dataclasses.replace(self.scalers[key], status=status)

    def _start(self, i: int) -> None:
        name = f"j-worker-{i}"
        self.pods[name] = w(i, "Pending", False) if name in self.held else w(i, busy=False)

    def _make(self, made: dict[str, Any]) -> None:
        body = (scaleout if made["kind"] == "ScaleOut" else scalein)(made["name"], "j", 1)
        body["spec"] = {**body["spec"], **made["spec"]}
        sc = scaler(body, created=f"2026-01-01T12:{len(self.made):02d}:00Z")
        self.scalers[sc.kind_name] = dataclasses.replace(sc, made_for=made["generation"])
        self.made.append(made["name"])

    def settle(self) -> None:
        """Passes until nothing is left to do; a crash ends a pass early, like a restart."""
        for _ in range(60):
            self.tick += 1
            try:
                if self.act() >= 60:
                    return
            except Crashed:
                continue
        raise AssertionError("never settled")

    def members(self) -> list[str]:
        return list(self.status.target_workers or [])


def world(n: int, *scalers: ScalerView) -> World:
    return World(
        replicas=n,
        status=JobStatus.from_dict(running_status(list(range(n)))),
        pods={f"j-worker-{i}": w(i, busy=False) for i in range(n)},  # Horovod leaves at once
        scalers={s.kind_name: s for s in scalers},
        published=[f"j-worker-{i}" for i in range(n)],
    )


def two_scale_outs() -> World:
    later = "2026-01-01T11:00:01Z"
    return world(2, scaler(scaleout("a", "j", 1)), scaler(scaleout("b", "j", 1), created=later))


def out_then_in() -> World:
    return world(
        2,
        scaler(scaleout("a", "j", 2)),
        scaler(scalein("b", "j", count=1), created="2026-01-01T11:00:01Z"),
    )


def kubectl_scale_up() -> World:
    wd = world(2)
    wd.set_replicas(4)
    return wd


def kubectl_scale_beyond_cap() -> World:
    wd = world(2, scaler(scaleout("a", "j", 1)))
    wd.set_replicas(3)
    wd.max_replicas = 9
    return wd


SCENARIOS: dict[str, tuple[Callable[[], World], int]] = {
    "two ScaleOuts": (two_scale_outs, 4),
    "ScaleOut then ScaleIn": (out_then_in, 3),
    "kubectl scale": (kubectl_scale_up, 4),
    "ScaleOut and kubectl scale": (kubectl_scale_beyond_cap, 3),
}


W = TypeVar("W", bound=World)


def each_crash(make: Callable[[], W], writes: int) -> Iterator[tuple[int, W]]:
    """The world, settled after a crash at each of the `writes` a clean run made, in turn."""
    for k in range(1, writes + 1):
        wd = make()
        wd.crash_at = k
        wd.settle()
        yield k, wd


def assert_scaled(wd: World, k: int, members: int, replicas: int) -> None:
    """The scale done as asked, its scalers succeeded, after a crash at write `k`."""
    assert len(wd.members()) == members, f"crash at write {k}: {wd.members()}"
    assert wd.replicas == replicas, f"crash at write {k}: spec replicas {wd.replicas}"
    assert all(s.phase == "ScaleSucceeded" for s in wd.scalers.values()), (k, wd.scalers)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_crash_at_any_write_never_undoes_a_scale(scenario: str) -> None:
    make, expected = SCENARIOS[scenario]
    clean = make()
    clean.settle()
    assert len(clean.members()) == expected and clean.replicas == expected
    for k, wd in each_crash(make, clean.writes):
        assert_scaled(wd, k, expected, expected)
        assert len(wd.made) <= len(clean.made), f"crash at write {k}: made {wd.made}"


def test_spec_replicas_show_the_target_while_a_scale_runs() -> None:
    wd = world(2, scaler(scaleout("a", "j", 2)))
    wd.pods["j-worker-0"] = w(0)
    wd.act()
    assert wd.status.current_scaler and wd.replicas == 4  # `kubectl get tj` TARGET


def test_a_failed_kubectl_scale_gives_back_the_real_size() -> None:
    wd = world(2)
    wd.held.add("j-worker-2")  # never comes up
    wd.set_replicas(3)
    wd.act()  # makes the ScaleOut of 1
    wd.act()  # starts it
    (made,) = [s for s in wd.scalers.values() if s.made_for]
    wd.tick = 100_000
    wd.settle()
    assert wd.scalers[made.kind_name].phase == "ScaleFailed"
    assert wd.replicas == 2 and len(wd.members()) == 2
    wd.set_replicas(3)  # asking again is a new request
    wd.act()
    assert len(wd.made) == 2


def test_kubectl_scale_just_after_the_operators_own_write_is_a_request() -> None:
    """The operator gives back the real size (2 of 3) and the user scales to 3 again before any
    pass has seen the 2: the 3 equals the value the operator's write replaced, yet it is a
    request, not that write still to do."""
    wd = world(2)
    wd.held.add("j-worker-2")  # never comes up
    wd.set_replicas(3)
    wd.act()  # makes the ScaleOut of 1
    wd.act()  # starts it
    wd.tick = 100_000
    for _ in range(20):
        wd.tick += 1
        wd.act()
        if wd.replicas == 2:
            break
    assert wd.replicas == 2  # the real size, given back
    wd.set_replicas(3)  # before another pass
    wd.settle()
    assert wd.replicas == 3 and len(wd.made) == 2
