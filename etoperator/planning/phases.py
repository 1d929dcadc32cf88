"""The job's phase, decided here alone: the steps of a pass say what happened (the job ended,
waits, starts a run, its launcher runs), and `next_phase` turns that and the phase the pass
started from into the phase it writes. `MOVES` is every move there is; the planner's property
test holds it to them."""

from __future__ import annotations

from dataclasses import dataclass

from etoperator import status as st

LIVE = (st.RUNNING, st.SCALING)  # the launcher runs: the job trains, maybe scaling

# From each phase, the phases a pass may leave it in (besides staying). An ended job stays
# ended: only one refused for its spec starts afresh once the spec is fixed. A suspended or
# queued job may end: its launcher finished before its deletion landed.
MOVES: dict[str | None, frozenset[str]] = {
    None: frozenset({st.CREATED, st.RUNNING, st.SCALING, st.QUEUED, st.SUSPENDED, *st.TERMINAL}),
    st.CREATED: frozenset({*LIVE, st.QUEUED, st.SUSPENDED, *st.TERMINAL}),
    st.RUNNING: frozenset({st.SCALING, st.CREATED, st.QUEUED, st.SUSPENDED, *st.TERMINAL}),
    st.SCALING: frozenset({st.RUNNING, st.CREATED, st.QUEUED, st.SUSPENDED, *st.TERMINAL}),
    st.SUSPENDED: frozenset({st.CREATED, *LIVE, st.QUEUED, *st.TERMINAL}),
    st.QUEUED: frozenset({st.CREATED, *LIVE, st.SUSPENDED, *st.TERMINAL}),
    # Refused for its spec, then fixed (only a job that had not started is refused: an edit of
    # one under way is held, lifecycle.hold_edit); a pod of it may still run (a refusal
    # deletes none).
    st.FAILED: frozenset({st.CREATED, *LIVE, st.QUEUED, st.SUSPENDED, st.SUCCEEDED}),
    st.SUCCEEDED: frozenset(),
}


@dataclass
class Happened:
    """What the steps of one pass found; each says it once, none writes the phase."""

    ended: str | None = None  # Succeeded or Failed
    waits: str | None = None  # Suspended or Queued: no pod of the job runs
    fresh: bool = False  # a new run starts: the first, a restart, a resume, a spec fixed
    launcher_running: bool = False


def next_phase(was: str | None, happened: Happened, scaling: bool) -> str | None:
    """The phase after a pass: an end is kept (a fresh run is only ever started for a job
    refused for its spec, once fixed), then an end, a wait, a running launcher (Scaling while
    a scale runs), a fresh run, in that order, win over what was."""
    if was in st.TERMINAL and not happened.fresh:
        return was
    if happened.ended:
        return happened.ended
    if happened.waits:
        return happened.waits
    if happened.launcher_running or (was in LIVE and not happened.fresh):
        return st.SCALING if scaling else st.RUNNING
    return st.CREATED if happened.fresh else was
