"""The run's notes: waits that came near their deadline, remarks on what was measured."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localcluster import runnotes
from localcluster.world import Timeout, wait_for


def test_a_wait_past_half_its_deadline_is_noted_and_a_quick_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "waits"
    monkeypatch.setenv(runnotes.ENV, str(path))
    wait_for(lambda: True, 1.0, "at once")
    start = time.monotonic()
    wait_for(lambda: time.monotonic() - start > 1.2, 2.0, "past 1.2 s", interval=0.05)
    with pytest.raises(Timeout):
        wait_for(lambda: False, 0.2, "never", interval=0.05)  # a failure says so itself
    got, remarks = runnotes.read(str(path))
    assert [w["what"] for w in got] == ["past 1.2 s"], got
    assert got[0]["took"] >= 1.2 and got[0]["timeout"] == 2.0, got
    assert "test_runnotes.py" in got[0]["test"], got
    assert remarks == []


def test_remarks_are_kept_in_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notes"
    monkeypatch.setenv(runnotes.ENV, str(path))
    runnotes.remark("first")
    runnotes.remark("second")
    assert [r["remark"] for r in runnotes.read(str(path))[1]] == ["first", "second"]
