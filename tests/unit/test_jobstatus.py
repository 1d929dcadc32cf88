"""The typed job status reads and writes the object's camelCase status without changing it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from etoperator.api.statuses import JobStatus

KNOWN = {
    "phase": st.sampled_from(["Created", "Running", "Scaling", "Failed"]),
    "currentScaler": st.sampled_from(["", "ScaleOut:ns/a"]),
    "targetWorkers": st.lists(st.sampled_from(["j-worker-0", "j-worker-1"]), max_size=2),
    "lastWorkerIndex": st.integers(-1, 9),
    "acceptedReplicas": st.integers(1, 9),
    "sshPublicKey": st.text(max_size=5),
    "somethingNewer": st.integers(),  # a field a later version writes: carried through
}


@given(st.fixed_dictionaries({}, optional=KNOWN))
def test_a_status_comes_back_as_it_was_read(raw: dict[str, object]) -> None:
    assert JobStatus.from_dict(raw).to_dict() == raw


def test_fields_read_by_name_and_absent_ones_stay_absent() -> None:
    s = JobStatus.from_dict({"currentWorkers": ["a"], "restartCount": 2})
    assert s.hosts == ["a"] and s.restart_count == 2 and s.phase is None
    s.phase, s.current_workers = "Running", None
    assert s.to_dict() == {"restartCount": 2, "phase": "Running"}
