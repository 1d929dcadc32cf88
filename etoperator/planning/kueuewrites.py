"""Kueue's writes, as the planner's steps emit them into the plan (queueing.py, surplus.py):
a Workload made (the core, the surplus, a slice), deleted, or brought up to date. Here, apart
from the other writes (writes.py), because the Plan that holds them (views.py) is what
writes.py reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DropWorkloads:
    """Every Workload of a job whose queue label was removed (it runs outside any queue)."""


@dataclass(frozen=True)
class DeleteWorkload:
    name: str


@dataclass(frozen=True)
class MakeWorkload:
    name: str
    workers: int
    replacing: str | None  # a slice: the Workload it replaces ("": a surplus asked whole)
    surplus: bool  # the workers above the job's core (minCount 1, a priority lower)


@dataclass(frozen=True)
class UpdateWorkload:
    """A family's current Workload (the core's or the surplus's): its count and activity
    (spec), then conditions set and the admission given back (status)."""

    core: bool
    resize: int | None = None
    activate: bool | None = None
    conditions: tuple[tuple[str, str, str, str], ...] = ()
    release: str = ""  # the eviction's reason, when the admission is given back


QueueWrite = DeleteWorkload | MakeWorkload | UpdateWorkload
