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
        # A low floor: on a machine busy with the rest of the suite the spinner may get only a
        # fifth of a core, and what is checked is that it is named with a share of one core.
        named = [b for b in machine.busiest(1.0, most=500, floor=0.01) if f"({spin.pid})" in b]
        assert named, machine.busiest(1.0, most=50)
        share = float(named[0].rsplit(": ", 1)[1])
        assert 0.01 < share <= 1.05, share  # one thread: at most one core, not ticks or percent
        assert "busiest:" in machine.snapshot()
    finally:
        spin.kill()
        spin.wait()
