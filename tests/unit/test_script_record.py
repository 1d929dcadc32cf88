"""The launcher's record of a scaler script (reconcile/scripts.py), run by the shell the
launcher has: a script outlives the exec that started it, and its end is read from the record.

When the operator dies, the apiserver closes the exec stream and the runtime kills the process
the exec started (the wrapper); the script it ran goes on. The record must still tell its end:
else the next operator waits out the script's timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from etoperator.reconcile.scripts import RECORD, RECORDED
from localcluster.world import wait_for


def wrapped(tmp: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["sh", "-c", RECORDED, "etoperator-script", "rec", *argv],
        env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def record(tmp: Path) -> str:
    argv = ["sh", "-c", RECORD, "etoperator-script", "rec"]
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_a_script_tells_its_output_and_code(tmp_path: Path) -> None:
    proc = wrapped(tmp_path, "sh", "-c", "echo out; echo err >&2; exit 3")
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 3
    assert sorted(out.split()) == ["err", "out"]
    assert record(tmp_path) == "exit 3"


def test_a_script_whose_wrapper_was_killed_still_records_its_end(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    # Waits for the test's word, and at most 30 s: a failed test leaves nothing running.
    script = (f"echo started; for i in $(seq 600); do [ -e {gate} ] && break; sleep 0.05; "
              "done; echo more; exit 3")  # fmt: skip
    proc = wrapped(tmp_path, "sh", "-c", script)
    try:
        wait_for(lambda: record(tmp_path) == "running", 10, "the script running")
        os.kill(proc.pid, signal.SIGKILL)  # the exec's own process, as the runtime kills it
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()  # nobody reads its output any more
        assert record(tmp_path) == "running"  # the script goes on
    finally:
        gate.touch()
    said = wait_for(lambda: (r := record(tmp_path)) != "running" and r, 10, "the script's end")
    assert said == "exit 3"
