from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Cluster, start_process_cluster

SSH_PORT = 2022  # the pods' sshd port (ssh finds it through the per-pod `Host` blocks)


def _why_not() -> str | None:
    venv_bin = Path(sys.executable).parent
    if os.geteuid() != 0:
        return "the process kubelet needs root (mount and PID namespaces, sshd)"
    if not (venv_bin / "horovodrun").exists():
        return "horovodrun is missing: run `make setup` (it builds Horovod)"
    for tool in ("unshare", "ssh"):
        if not shutil.which(tool):
            return f"{tool} is missing: run `make setup`"
    if not Path("/usr/sbin/sshd").exists():
        return "sshd is missing: run `make setup`"
    with socket.socket() as s:
        try:
            s.bind(("127.20.255.254", SSH_PORT))
        except OSError as exc:
            return f"cannot bind loopback addresses on port {SSH_PORT} ({exc})"
    return None


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = _why_not()
    if why:
        pytest.fail(why)
    c = start_process_cluster(tmp_path_factory.mktemp("chain"), SSH_PORT)
    try:
        yield c
    finally:
        c.stop()
