"""The operator's restarts from a fork server: each a real operator process of its own (its
session, its log lines), killed as a child would be, the server's imports made once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.operatorproc import OperatorProcess
from localcluster.world import wait_for

# An apiserver nobody listens at: the operator starts and keeps trying to reach it.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def operator(tmp_path: Path) -> Iterator[OperatorProcess]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    op = OperatorProcess(kubeconfig, tmp_path / "operator.log", ssh_port=22, warm=True)
    yield op
    op.kill()  # not stopped gracefully: that waits out its tries to reach the apiserver
    op.stop()


def gone(pid: int) -> None:
    """Its exit is seen (a pidfd) a moment before the kernel's reaping removes it."""
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 5, f"{pid} gone")


def started(op: OperatorProcess, times: int) -> None:
    wait_for(lambda: op.log.read_text().count("etoperator started") == times, 30, "started")


def test_restarts_are_forks_of_one_server_each_a_process_of_its_own(
    operator: OperatorProcess,
) -> None:
    operator.start()
    started(operator, 1)
    first = operator.proc
    assert first is not None and operator.alive()
    server = parent_of(first.pid)
    assert server != os.getpid()  # the server's child, not ours
    assert os.getsid(first.pid) == first.pid  # a session (a process group) of its own
    operator.kill()
    assert not operator.alive()
    gone(first.pid)
    operator.start()
    started(operator, 2)
    second = operator.proc
    assert second is not None and second.pid != first.pid and operator.alive()
    assert parent_of(second.pid) == server  # the same server: its imports made once


def test_another_environment_is_another_server_and_stop_ends_both(
    operator: OperatorProcess,
) -> None:
    operator.start()
    started(operator, 1)
    assert operator.proc is not None
    server = parent_of(operator.proc.pid)
    operator.kill()
    operator.env = {"ETOPERATOR_TEST_MARK": "1"}  # read by whatever imports it: a new server
    operator.start()
    started(operator, 2)
    assert operator.proc is not None
    now = parent_of(operator.proc.pid)
    assert now != server
    gone(server)
    environ = Path(f"/proc/{operator.proc.pid}/environ").read_bytes()
    assert b"ETOPERATOR_TEST_MARK=1" in environ.split(b"\0")
    pid = operator.proc.pid
    operator.stop()
    gone(pid)
    gone(now)


def test_an_operator_stopped_as_soon_as_started_stops(operator: OperatorProcess) -> None:
    """The server told the pid before its child had made its own session: a stop at once met
    no process group (ProcessLookupError) and waited for an end that never came (a whole CI
    run hung so). The pid is told once the session is made."""
    for _ in range(20):
        operator.start()
        proc = operator.proc
        assert proc is not None
        assert os.getpgid(proc.pid) == proc.pid, "told before its session was made"
        operator.kill()
        gone(proc.pid)
