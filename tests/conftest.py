from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

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
