"""The static reference runs the suite compares elastic runs with, run on this machine."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from localcluster import digits


def test_a_static_torchrun_run_leaves_nothing_in_the_machine_s_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun's log directory (its mkdtemp) and torch's compile cache went to /tmp and
    stayed there after the suite's first run on a machine."""
    host = tmp_path / "tmp"
    host.mkdir()
    monkeypatch.setenv("TMPDIR", str(host))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    run = digits.static_torchrun(epochs=1)
    assert run.accuracy is not None, run.text[-2000:]
    assert sorted(p.name for p in host.iterdir()) == []
