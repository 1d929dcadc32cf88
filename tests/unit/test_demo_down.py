"""`make demo-down` tells a demo that has ended from one that runs: an ended demo whose parent
has not reaped it yet (a zombie: what a script that started it leaves until it waits) had
kept demo-down waiting out its whole 60 s."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import demo
from localcluster.world import wait_for


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_ended_demo_not_yet_reaped_is_not_running(
    child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    demo.pid_file(tmp_path).write_text(str(child.pid))
    assert demo.running_pid(tmp_path) == child.pid
    child.send_signal(signal.SIGTERM)
    wait_for(lambda: state_of(child.pid) == "Z", 10, "the child ended, not reaped")
    assert demo.running_pid(tmp_path) is None
    assert demo.down(tmp_path, explicit=True) == 0  # no demo to stop: it returns at once
    assert child.poll() is not None  # reaped only now, by its parent


def test_a_running_demo_is_stopped_and_down_returns_once_it_has_ended(
    child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    demo.pid_file(tmp_path).write_text(str(child.pid))
    assert demo.down(tmp_path, explicit=True) == 0
    assert state_of(child.pid) == "Z"  # ended (SIGTERM); its parent, this test, reaps it
