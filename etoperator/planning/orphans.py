"""Scalers no job loop looks after."""

from __future__ import annotations

import copy
from datetime import datetime

from etoperator import status as st
from etoperator.api.statuses import ScalerStatus
from etoperator.clock import iso
from etoperator.planning.views import ScalerView
from etoperator.status import Event


def plan_orphan_scaler(
    sc: ScalerView, job_exists: bool, now: datetime
) -> tuple[ScalerStatus | None, Event | None]:
    """Status (and event) for a scaler no job loop looks after: refuse an invalid one, wait for
    a job that does not exist yet, fail one whose job was deleted. (None, None): no change."""
    if sc.phase in st.SCALE_TERMINAL:
        return None, None
    job = sc.spec.job if sc.spec else "?"
    if sc.spec is None:
        error = sc.error or "invalid spec"
        ctype, reason, msg, phase = st.SCALE_FAILED, "InvalidSpec", error, st.SCALE_FAILED
    elif job_exists:
        return None, None  # its job's loop runs it
    elif sc.owned or sc.phase == st.SCALE_RUNNING:
        ctype, reason, msg, phase = (
            st.SCALE_FAILED,
            "JobDeleted",
            f"job {job} was deleted",
            st.SCALE_FAILED,
        )
    else:
        ctype, reason, msg, phase = "Waiting", "JobNotFound", f"waiting for job {job} to exist", ""
    t = iso(now)
    conds, changed = st.set_condition(sc.status.conditions or [], ctype, "True", reason, msg, t)
    if not changed and sc.phase == phase:
        return None, None
    new = copy.deepcopy(sc.status)
    new.conditions, new.phase = conds, phase
    if phase == st.SCALE_FAILED:
        new.completion_time = t
        return new, Event("Warning", reason, msg)
    return new, None
