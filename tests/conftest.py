from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kubeconfig", default=None, help="run the real-cluster tier against it")


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
# process makes once: the full chain's modules in turn (each starts its own chain); the
# integration tier in two halves of about seven minutes each (by a whole run's durations),
# each with its own cluster (a package fixture is made once per process); unit modules go
# wherever there is room.
INTEGRATION_HALF_A = {
    "test_crash.py", "test_horovod.py", "test_kueue.py", "test_leader.py", "test_gangs.py",
}  # fmt: skip


def group_of(nodeid: str) -> str:
    """Its module (a module's fixtures, such as the unit tier's sshd, are made once, by one
    process), but for the integration tier's two halves and the full chain, whose modules
    train one at a time: on two cores, trainings side by side starve each other past their
    timeouts."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) == 3 and parts[1] == "integration":
        return "integration-" + ("a" if parts[2] in INTEGRATION_HALF_A else "b")
    if len(parts) == 3 and parts[1] == "fullchain":
        return "fullchain"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        """Tests of one group to one worker; the largest groups handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)
