"""A niced run's clusters yield CPU as the run does: its processes, their sessions' groups and
its nodes' pods (on two cores, the training under test must not wait for the tests beside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import procs

CHILD = """
import json, os, sys, uuid
from pathlib import Path
from localcluster import procs
os.nice(int(sys.argv[1]))
log = Path(sys.argv[2])
p = procs.spawn(["sleep", "30"], log, nice=int(sys.argv[3]))
stat = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
group = Path(f"/proc/{p.pid}/autogroup")
cg = Path("/sys/fs/cgroup/cpu") / f"etoperator-test-{uuid.uuid4().hex[:8]}"
shares = None
if Path("/sys/fs/cgroup/cpu/cpu.shares").exists() and os.geteuid() == 0:
    cg.mkdir()
    try:
        procs.weigh_as_self(cg)
        shares = int((cg / "cpu.shares").read_text())
    finally:
        cg.rmdir()
print(json.dumps({
    "nice": int(stat[16]),
    "group": int(group.read_text().split()[-1]) if group.exists() else None,
    "shares": shares,
}))
procs.stop(p, 1)
"""


def run_niced(nice: int, extra: int, tmp_path: Path) -> dict[str, int | None]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(nice), str(tmp_path / "log"), str(extra)],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    result: dict[str, int | None] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize(("nice", "extra"), [(4, 0), (4, 3), (0, 19), (0, 0)])
def test_a_child_runs_at_the_runs_nice_and_its_session_group_too(
    nice: int, extra: int, tmp_path: Path
) -> None:
    base = os.nice(0)
    level = min(base + nice + extra, 19)
    got = run_niced(nice, extra, tmp_path)
    assert got["nice"] == level
    if got["group"] is not None and level > base:
        assert got["group"] == level
    if got["shares"] is not None:
        assert got["shares"] == procs.NICE_WEIGHTS[min(base + nice, 19)]


def test_a_run_of_several_processes_weighs_as_many_and_leaves_no_group() -> None:
    """The static training run's ranks share a session: grouped by it, they weighed as one."""
    with procs.cpus_of_their_own("test", 3) as join:
        child = subprocess.run(
            ["cat", "/proc/self/cgroup"], capture_output=True, text=True, check=True,
            preexec_fn=join,
        )  # fmt: skip
        group = Path("/sys/fs/cgroup/cpu") / f"etoperator-test-{os.getpid()}"
        if not group.exists():
            pytest.skip("no cpu cgroup of ours here (cgroup v1, root)")
        assert int((group / "cpu.shares").read_text()) == 3 * procs.NICE_WEIGHTS[os.nice(0)]
        assert f"/etoperator-test-{os.getpid()}" in child.stdout
    assert not group.exists()
