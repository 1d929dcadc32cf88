from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import runnotes
from tests.support import machine


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kubeconfig", default=None, help="run the real-cluster tier against it")


RUN_NOTES = pytest.StashKey[str]()
MACHINE_AT_START = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # One file for the whole run's notes, made by the process that prints them; the suite's
    # worker processes and what they start inherit its name.
    if not os.environ.get("PYTEST_XDIST_WORKER") and runnotes.ENV not in os.environ:
        fd, path = tempfile.mkstemp(prefix="etoperator-run-notes-")
        os.close(fd)
        os.environ[runnotes.ENV] = path
        config.stash[RUN_NOTES] = path
        config.stash[MACHINE_AT_START] = machine.snapshot()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    path = config.stash.get(RUN_NOTES, None)
    if path is None:
        return
    waits, remarks = runnotes.read(path)
    os.unlink(path)
    terminalreporter.section("the machine")
    terminalreporter.line(f"at the start: {config.stash[MACHINE_AT_START]}")
    terminalreporter.line(f"at the end: {machine.snapshot()}")
    if remarks:
        terminalreporter.section("remarks")
        for r in remarks:
            terminalreporter.line(f"{r['remark']}  ({r['test']})")
    if waits:
        terminalreporter.section(f"{len(waits)} waits took over half their deadline")
        for w in waits[:12]:
            terminalreporter.line(f"{w['took']}s of {w['timeout']}s  {w['what']}  {w['test']}")


def real_nodes_missing() -> str | None:
    """Why real nodes cannot run here, if they cannot."""
    if os.geteuid() != 0:
        return "real nodes need root (network and mount namespaces, cgroups, containerd)"
    for tool in ("unshare", "nsenter", "ip", "iptables", "buildah", "mmdebstrap"):
        if not shutil.which(tool):
            return f"{tool} is missing: run `make setup`"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + rep.when, rep)


# `make test` runs the tiers side by side (pytest-xdist, `-n`): most of a tier's time is waiting
# on clusters, not computing. A group runs on one worker process, in order, sharing what that
# process makes once (a module's fixtures; a tier's cluster or chain, a package fixture).
# What trains (the full chain's modules on one chain, the demo's own cluster, and the
# integration tests that run horovodrun) is one group: on two cores, trainings side by side
# starve each other past their timeouts (seen again with test_horovod.py beside the full chain).
# The rest of the integration tier is three parts, each with a cluster of its own: four
# processes (`JOBS=4`) took 12.7 min where three took 13.5-14 (stop 57, the same tree: the
# suite waits more than it computes). Kept apart: test_rbac.py (b: it reads its operator's
# every request in the cluster's audit log) and test_lifecycle.py (c: it runs operators with
# more rights); the crash at every write is three tests over a and c; the slow joiner's test
# trains, but mostly waits (its worker sleeps 40 s before starting): b. test_horovod's two
# short trainings (across two nodes, a drain) went to a part once: at its priority they took
# twice as long, and beside the training process two trainings at once slowed both past their
# bounds. test_torchrun.py's trainings are light (a step every 0.1 s, two to four ranks).
# Unit modules go anywhere.
TRAINING = {"tests/integration/test_horovod.py"}
# By the junit sums of a fresh clone's run (`make groups`), 780-810 s each beside the training
# (900): a holds the Torchrun trainings, b Kueue's and the RBAC audit, c the scaling paths.
INTEGRATION = {
    "a": {"test_torchrun.py", "test_crash.py", "test_operations.py"},
    "c": {"test_gangs.py", "test_lifecycle.py", "test_scaling.py", "test_robustness.py"},
}  # the rest: b
TO_PART = {
    "tests/integration/test_crash.py::test_a_crash_at_every_write_of_a_torchrun_job_s_scale_is_"
    "harmless": "c",
    "tests/integration/test_crash.py::test_a_crash_at_every_write_of_a_save_then_stop_loses_no"
    "_step": "c",
    "tests/integration/test_horovod.py::test_a_worker_slow_to_start_joins_and_the_job_trains"
    "_on": "b",
    "tests/fullchain/test_demo.py::test_a_killed_demo_leaves_nothing_once_demo_down_runs": "a",
}


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if nodeid in TO_PART:
        return "integration-" + TO_PART[nodeid]
    if path in TRAINING or (len(parts) == 3 and parts[1] == "fullchain"):
        return "training"
    if len(parts) == 3 and parts[1] == "integration":
        part = next((k for k, files in INTEGRATION.items() if parts[2] in files), "b")
        return "integration-" + part
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        """Tests of one group to one worker; the largest groups handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


# The training process is the suite's critical path, and its trainings are latency-bound (each
# step an allreduce that waits for the slowest rank): beside the integration halves on two
# cores they ran 3x slower than alone. The halves run at a lower CPU priority, their clusters
# too (started after, they inherit it): the trainings get a core when they need one, and the
# halves take what the trainings leave. The kernel here groups CPU time by session (autogroup)
# and a node's pods by its cgroup root, so the nice reaches them through localcluster/procs.py
# (each child's session group, each node's cpu.shares), not by inheritance alone. Only side by
# side (3 processes or more): alone, a process may run both kinds.
HALF_NICE = 4
_niced: list[bool] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    side_by_side = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) >= 3
    if side_by_side and not _niced and group_of(item.nodeid).startswith("integration-"):
        os.nice(HALF_NICE)
        _niced.append(True)
