"""The audit log read incrementally (localcluster/controlplane.py): every event once, a line
being written only once it is whole, a new file read from its start."""

from __future__ import annotations

import json
from pathlib import Path

from localcluster.controlplane import ControlPlane


def line(n: int) -> bytes:
    return json.dumps({"auditID": str(n)}).encode() + b"\n"


def ids(cp: ControlPlane) -> list[str]:
    return [ev["auditID"] for ev in cp.audit()]


def test_events_are_read_once_and_a_half_line_waits(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path, bin=tmp_path)
    assert cp.audit() == []
    cp.audit_log.write_bytes(line(1) + line(2))
    assert ids(cp) == ["1", "2"]
    half = line(3)[:5]
    with cp.audit_log.open("ab") as f:
        f.write(half)
    assert ids(cp) == ["1", "2"]
    with cp.audit_log.open("ab") as f:
        f.write(line(3)[5:] + line(4))
    assert ids(cp) == ["1", "2", "3", "4"]
    assert ids(cp) == ["1", "2", "3", "4"]


def test_a_new_shorter_file_is_read_from_its_start(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path, bin=tmp_path)
    cp.audit_log.write_bytes(line(1) + line(2))
    assert ids(cp) == ["1", "2"]
    cp.audit_log.write_bytes(line(9))
    assert ids(cp) == ["9"]
