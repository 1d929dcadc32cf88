"""The project's Horovod build, under plain `horovodrun` on this machine: a rank that stops
answering fails its peers' Gloo operations within HOROVOD_GLOO_OP_TIMEOUT_SECONDS, not the
rendezvous timeout (30 s), so an elastic job resets within seconds of losing a worker; and its
elastic driver runs the host-discovery script with no Python interpreter started in between."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.fullchain

# Rank 1 freezes itself (SIGSTOP: its sockets stay open, nothing more is sent); rank 0 reports
# how long its next allreduce waited before it failed.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    import horovod.torch as hvd

    hvd.init()
    for step in range(1000):
        if hvd.rank() == 1 and step == 20:
            os.kill(os.getpid(), signal.SIGSTOP)
        last = time.monotonic()
        try:
            hvd.allreduce(torch.ones(4), name="x")
        except Exception as exc:
            print(f"FAILED after={time.monotonic() - last:.1f} at={time.time():.2f} "
                  f"{type(exc).__name__}", flush=True)
            sys.exit(3)
    """
)


def _run(tmp: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(seconds rank 0's allreduce waited on the frozen rank, seconds from its failure to
    horovodrun's end, the output)."""
    script = tmp / "freeze.py"
    script.write_text(SCRIPT)
    venv = Path(sys.executable).parent
    cmd = [str(venv / "horovodrun"), "-np", "2", "-H", "localhost:2", sys.executable, str(script)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, **env, "PATH": f"{venv}:{os.environ['PATH']}"},
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=120)
        ended = time.time()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the frozen rank ignores everything else
        proc.wait()
    m = re.search(r"FAILED after=([\d.]+) at=([\d.]+)", out)
    assert m, out[-3000:]
    return float(m[1]), ended - float(m[2]), out


def test_a_frozen_rank_fails_its_peer_within_the_op_timeout(tmp_path: Path) -> None:
    waited, ending, out = _run(tmp_path, {})
    assert waited < 10, f"waited {waited} s (the default op timeout is 5 s)\n{out[-2000:]}"
    # And the job ends, the frozen rank too: 11 s after the failure alone (horovodrun's grace
    # for the ranks it terminates). Its start-up, two ranks importing torch, is no part of it:
    # beside the suite a whole run took 63 s once, 28 s alone.
    assert ending < 30, f"horovodrun ended {ending:.1f} s after the failure\n{out[-2000:]}"


def test_the_op_timeout_is_the_users_to_set(tmp_path: Path) -> None:
    waited, _, out = _run(tmp_path, {"HOROVOD_GLOO_OP_TIMEOUT_SECONDS": "2"})
    assert waited < 4.5, f"waited {waited} s with a 2 s op timeout\n{out[-2000:]}"


def test_the_discovery_script_runs_as_a_child_not_through_a_new_interpreter(tmp_path: Path) -> None:
    """Upstream starts a Python interpreter for each call of the script (every second)."""
    from horovod.runner.elastic.discovery import HostDiscoveryScript  # type: ignore[import-untyped]

    chain = tmp_path / "chain"
    script = tmp_path / "discover.sh"
    # The script's parent is the shell that runs it; that shell's parent, the caller.
    script.write_text(
        f"#!/bin/sh\nps -o ppid= -p $PPID > {chain}\necho worker-0:2\necho worker-1\n"
    )
    script.chmod(0o755)
    hosts = HostDiscoveryScript(str(script), 1).find_available_hosts_and_slots()
    assert hosts == {"worker-0": 2, "worker-1": 1}
    assert int(chain.read_text()) == os.getpid(), "a process between the caller and the shell"
    script.write_text("#!/bin/sh\nexit 3\n")
    with pytest.raises(RuntimeError, match="Exit code: 3"):
        HostDiscoveryScript(str(script), 1).find_available_hosts_and_slots()
