"""The run's closing note on what else the machine did: a process spinning beside it is named."""

from __future__ import annotations

import subprocess
import sys

from tests.support import machine


def test_a_process_spinning_beside_the_run_is_named_with_its_share() -> None:
    spin = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.time()+20\nwhile time.time()<t: pass"]
    )
    try:
        named = [b for b in machine.busiest(1.0, most=50) if f"({spin.pid})" in b]
        assert named, machine.busiest(1.0, most=50)
        assert float(named[0].rsplit(": ", 1)[1]) > 0.3  # a core's share, on a busy machine
        assert "busiest:" in machine.snapshot()
    finally:
        spin.kill()
        spin.wait()
