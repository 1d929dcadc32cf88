"""What a pass of the planner returns: the writes its steps emitted (kinds.py; writes.py puts
them in their one order; the pass's events among them), the job status it will write, and
what is not a write (scripts to run, when to come back). The properties read the writes
back, for the steps that build on an earlier one's and for the tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from etoperator.api.statuses import JobStatus, ScalerStatus
from etoperator.builders.common import Placement
from etoperator.planning import kinds as k
from etoperator.status import Event

W = TypeVar("W")


@dataclass
class Plan:
    status: JobStatus  # the job's, as the pass writes it (JobStatusWrite when it changed)
    writes: list[k.Write] = field(default_factory=list)  # as the steps emitted them
    requeue: float = 60.0  # steady state: a resync now and then; events wake us sooner
    pending: list[str] = field(default_factory=list)  # why the next pass should come soon
    settled_scalers: list[tuple[str, str, str]] = field(default_factory=list)  # kind, result, secs
    # (scaler, argv, timeout, record): scripts to start; a record names where the launcher
    # keeps the run's pid and exit code.
    run_scripts: list[tuple[tuple[str, str], list[str], int, str]] = field(default_factory=list)
    # (scaler, record, over): scripts marked started that this pass did not see end: ask the
    # launcher's record (`over`: past its timeout, so a run not recorded will never end).
    check_scripts: list[tuple[tuple[str, str], str, bool]] = field(default_factory=list)
    surplus_workers: list[int] = field(default_factory=list)  # of the workers created
    placement: dict[str, Placement] = field(default_factory=dict)  # for the pods it creates

    def emit(self, write: k.Write, replaces: Callable[[k.Write], bool] | None = None) -> None:
        """A write added; `replaces`: which earlier ones it stands for (dropped)."""
        if replaces is not None:
            self.writes = [w for w in self.writes if not replaces(w)]
        self.writes.append(write)

    def put(self, write: k.Write) -> None:
        """A write of which a pass makes one: a later one stands for the earlier."""
        self.emit(write, lambda w: type(w) is type(write))

    def drop(self, kind: type) -> None:
        self.writes = [w for w in self.writes if type(w) is not kind]

    def of(self, kind: type[W]) -> list[W]:
        return [w for w in self.writes if isinstance(w, kind)]

    def one(self, kind: type[W]) -> W | None:
        found = self.of(kind)
        return found[-1] if found else None

    def tell(self, event: Event, scaler: tuple[str, str] | None = None) -> None:
        """An event of the job (of scaler `scaler`, kind and name): the pass tells them all
        at once, after its statuses."""
        told = self.one(k.TellEvents) or k.TellEvents()
        if scaler is None:
            self.put(k.TellEvents((*told.job, event), told.scalers))
        else:
            self.put(k.TellEvents(told.job, (*told.scalers, (scaler, event))))

    def stop_at_once(self, names: list[str]) -> None:
        """Those of the pods deleted stopped at once (victims past their drain)."""
        self.writes = [
            k.DeletePod(w.name, True) if isinstance(w, k.DeletePod) and w.name in names else w
            for w in self.writes
        ]

    # Read back: what a later step builds on, and what the tests look at.
    @property
    def hosts(self) -> list[str] | None:
        """The host list this pass publishes; None: the ConfigMap's is left as it is."""
        w = self.one(k.HostList)
        return list(w.hosts) if w else None

    @property
    def events(self) -> list[Event]:
        told = self.one(k.TellEvents)
        return list(told.job) if told else []

    @property
    def scaler_events(self) -> dict[tuple[str, str], list[Event]]:
        told, by = self.one(k.TellEvents), dict[tuple[str, str], list[Event]]()
        for scaler, event in told.scalers if told else ():
            by.setdefault(scaler, []).append(event)
        return by

    @property
    def delete_pods(self) -> list[str]:
        return [w.name for w in self.of(k.DeletePod)]

    @property
    def stop_now(self) -> list[str]:
        return [w.name for w in self.of(k.DeletePod) if w.now]

    @property
    def create_workers(self) -> list[int]:
        w = self.one(k.WorkerObjects)
        return list(w.indices) if w else []

    @property
    def services(self) -> list[str]:
        w = self.one(k.WorkerObjects)
        return list(w.services) if w else []

    @property
    def create_launcher(self) -> bool:
        return self.one(k.MakeLauncher) is not None

    @property
    def make_gang(self) -> bool:
        return self.one(k.MakeGang) is not None

    @property
    def spec_replicas(self) -> int | None:
        w = self.one(k.SpecReplicas)
        return w.replicas if w else None

    @property
    def scaler_status(self) -> dict[tuple[str, str], ScalerStatus]:
        return {w.kind_name: w.status for w in self.of(k.ScalerStatusWrite)}

    @property
    def adopt_scalers(self) -> list[tuple[str, str]]:
        return [w.kind_name for w in self.of(k.AdoptScaler)]

    @property
    def create_scalers(self) -> list[dict[str, Any]]:
        return [w.wanted for w in self.of(k.MakeScaler)]

    @property
    def make_secret(self) -> bool:
        w = self.one(k.MakeBasics)
        return bool(w and w.secret)

    @property
    def make_config_map(self) -> bool:
        w = self.one(k.MakeBasics)
        return bool(w and w.config_map)

    @property
    def make_access(self) -> tuple[tuple[str, str], ...]:
        w = self.one(k.MakeLauncherAccess)
        return w.objects if w else ()

    @property
    def update_role(self) -> bool:
        return self.one(k.UpdateLauncherRole) is not None

    # Kueue's.
    def made(self, surplus: bool, slice_: bool) -> k.MakeWorkload | None:
        """The core, the surplus or a slice (`replacing` set) this pass makes."""
        kind = [w for w in self.of(k.MakeWorkload)
                if w.surplus == surplus and (w.replacing is not None) == slice_]  # fmt: skip
        return kind[0] if kind else None

    def updated(self, core: bool) -> k.UpdateWorkload:
        found = [w for w in self.of(k.UpdateWorkload) if w.core == core]
        return found[0] if found else k.UpdateWorkload(core)

    @property
    def delete_workloads(self) -> list[str]:
        return [w.name for w in self.of(k.DeleteWorkload)]

    @property
    def make_workload(self) -> int | None:
        """The core Workload to make: its workers."""
        made = self.made(False, False)
        return made.workers if made else None

    @property
    def make_surplus(self) -> int | None:
        made = self.made(True, False)
        return made.workers if made else None

    @property
    def make_slice(self) -> tuple[str, int, str] | None:
        """(name, workers, the Workload it replaces: "" for a new surplus asked whole)"""
        made = self.made(True, True)
        return (made.name, made.workers, made.replacing or "") if made else None
