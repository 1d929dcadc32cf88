"""A torchrun worker's leave on the real agent that is its container's first process, as it
is in a pod (the kernel drops a SIGSTOP sent to such a process from inside its namespace)."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from torch._C._distributed_c10d import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

from etoperator import leave as hook_side
from etoperator import rendezvous, torchagent
from tests.support.relay import Relay

pytestmark = pytest.mark.skipif(
    not shutil.which("unshare") or not shutil.which("nsenter") or os.geteuid() != 0,
    reason="needs unshare, nsenter and root for a PID namespace",
)

STEPS = """
import os, signal, sys, time
def stopped(*_):
    print("worker stopped", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
print(f"worker started {os.getpid()}", flush=True)
while True:
    time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stream:
    """A process's output lines as they come, read by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, list[str]()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def wait_for(self, text: str, after: int = 0, within: float = 90) -> int:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = [i for i, line in enumerate(self.lines) if i >= after and text in line]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {within} s: {self.lines[-30:]}")


def start_agent(tmp_path: Path, port: int, addr: str, first: bool, monitor: float = 0.1) -> Stream:
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    argv = [sys.executable, "-u", torchagent.__file__, "--nnodes=1:3",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=r", f"--monitor-interval={monitor}", str(script)]  # fmt: skip
    if first:  # unshare forks the agent as PID 1 of a new PID namespace, as a container's
        argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["PET_LOCAL_ADDR"], env["TMPDIR"] = addr, str(tmp_path)  # a container's own /tmp
    # a session of its own: its forkserver and workers go with it at the end (a container's
    # do with the container)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    return Stream(proc)


def first_process(agent: Stream) -> str:
    """The agent's pid as its PID namespace's first process (unshare's child)."""
    out = subprocess.run(["pgrep", "-P", str(agent.proc.pid)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return out.split()[0]


def hook(
    pid1: str, tmp: Path, endpoint: str, *args: str, python: tuple[str, ...] = (sys.executable,)
) -> subprocess.Popen[bytes]:
    """The leave, run inside the agent's container (its PID and mount namespaces, its
    environment) as the kubelet runs a preStop hook; the launcher at `endpoint`."""
    env = {**os.environ, "PET_LOCAL_ADDR": "127.0.0.2", "PET_RDZV_ENDPOINT": endpoint}
    env["TMPDIR"] = str(tmp)
    argv = [*python, hook_side.__file__, *args]
    return subprocess.Popen(["nsenter", "-t", pid1, "-p", "-m", *argv], env=env)


def two_agents(world: tuple[int, Path, list[subprocess.Popen[str]]]) -> tuple[Stream, Stream]:
    """A leaving agent (its container's first process) and a staying one, both training."""
    port, tmp_path, procs = world
    leaving = start_agent(tmp_path, port, "127.0.0.2", first=True)
    staying = start_agent(tmp_path, port, "127.0.0.3", first=False)
    procs += [leaving.proc, staying.proc]
    leaving.wait_for("worker started")
    staying.wait_for("worker started")
    return leaving, staying


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[int, Path, list[subprocess.Popen[str]]]]:
    port = free_port()
    discover = tmp_path / "discover"
    discover.write_text("#!/bin/sh\necho a\necho b\n")
    discover.chmod(0o755)
    argv = [sys.executable, "-u", rendezvous.__file__, "serve", str(port), "r", "1",
            str(discover), str(tmp_path / "save-request")]  # fmt: skip
    serve = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # fmt: skip
    procs = [serve]
    try:
        # listening before any agent starts: an agent finding the endpoint's port free on
        # its own host would hold the store itself
        Stream(serve).wait_for("serving on port")
        yield port, tmp_path, procs
    finally:
        for proc in procs:  # SIGTERM first: an agent killed outright leaves its semaphores
            with contextlib.suppress(ProcessLookupError, PermissionError):  # in /dev/shm
                os.killpg(proc.pid, signal.SIGTERM)  # (unshare ignores it, its agent not)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the agents' sessions, whole
            proc.kill()
            proc.wait()


def a_node_waits(port: int) -> None:
    """What a new agent's join does to the rendezvous: it waits for the running round."""
    backend = C10dRendezvousBackend(TCPStore("127.0.0.1", port, is_master=False), "r")
    while True:
        got = backend.get_state()
        assert got is not None
        state, token = pickle.loads(got[0]), got[1]
        newcomer = _NodeDesc("127.0.0.9", 1, 0)
        state.wait_list.add(newcomer)
        state.last_heartbeats[newcomer] = datetime.now(UTC)
        if backend.set_state(pickle.dumps(state), token)[2]:  # type: ignore[index]
            return


def wait_rejoined(port: int, addr: str) -> None:
    """Until the agent of `addr` waits in the rendezvous again (it restarted its worker)."""
    backend = C10dRendezvousBackend(TCPStore("127.0.0.1", port, is_master=False), "r")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = backend.get_state()
        if got is not None and addr in {n.addr for n in pickle.loads(got[0]).wait_list}:
            return
        time.sleep(0.05)
    raise AssertionError(f"{addr} never waited again")


def test_a_leaving_agent_that_is_its_container_s_first_process_is_held(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """While its leave is taken (here: a launcher that does not answer, 5 s each try), the leaving
    agent neither restarts its worker for a membership change nor joins another round; once
    the hook ends it, it ends at once."""
    port, tmp_path, procs = world
    leaving, staying = two_agents(world)
    pid1 = first_process(leaving)
    silent = socket.socket()  # a launcher that takes the connection and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    leave = hook(pid1, tmp_path, f"127.0.0.1:{silent.getsockname()[1]}")
    procs.append(leave)  # type: ignore[arg-type]
    held = leaving.wait_for("leave: holding")
    a_node_waits(port)
    staying.wait_for("worker stopped")  # a membership change, as the staying agent saw it
    wait_rejoined(port, "127.0.0.3")  # by then a leaving agent not held would have moved too
    assert leave.poll() is None, "the hook ended before the change reached the agents"
    silent.close()  # the launcher gone at last
    leave.wait(timeout=60)
    ended = leaving.wait_for("leave: done", after=held)
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    restarted = [line for line in leaving.lines[held:ended] if line.startswith("worker")]
    assert not restarted, f"the leaving agent moved while held: {leaving.lines[held:ended]}"
    # it ends at the hook's SIGTERM, its worker too (sys.exit(0) at it: not killed 30 s later)
    leaving.proc.wait(timeout=15)


def test_a_leave_when_the_launcher_is_gone_ends_the_agent_at_once_without_a_failure(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """A whole stop deletes the launcher first: a worker's leave then has nothing to leave,
    which is no failure of its hook (no FailedPreStopHook at every stop) and waits for no
    timeout of torch's client."""
    port, tmp_path, procs = world
    (tmp_path / "discover").write_text("#!/bin/sh\necho a\n")  # one host: its round closes
    leaving = start_agent(tmp_path, port, "127.0.0.2", first=True)
    procs.append(leaving.proc)
    leaving.wait_for("worker started", within=120)
    pid1 = first_process(leaving)
    assert hook(pid1, tmp_path, f"127.0.0.1:{free_port()}").wait(timeout=30) == 0
    said = leaving.wait_for("leave: nothing to leave")
    took = float(leaving.lines[said].rsplit("after ", 1)[1].split()[0])
    assert took < 5, leaving.lines[said]  # torch's client would have retried for 5 s or more
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    leaving.proc.wait(timeout=15)


def test_a_leave_in_a_whole_stop_returns_at_once_and_restarts_no_one(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """A suspension or an eviction: the launcher's save hook asks the training to save, and
    the workers' leaves come meanwhile. Taken, a leave would restart the others' training
    mid-save (a membership change); none is, the hook returns without waiting for one, the
    leaving node stays in the round the run ends in and its own training goes on."""
    port, tmp_path, procs = world
    leaving, staying = two_agents(world)
    pid1 = first_process(leaving)
    (tmp_path / "save-request").touch()  # what the launcher's preStop does first
    store = TCPStore("127.0.0.1", port, is_master=False)
    deadline = time.monotonic() + 30
    while not store.check([rendezvous.STOPPING]):
        assert time.monotonic() < deadline, "the launcher never saw its run stop"
        time.sleep(0.05)
    assert hook(pid1, tmp_path, f"127.0.0.1:{port}").wait(timeout=60) == 0
    leaving.wait_for("leave: nothing to leave: the whole run stops")
    # The hold is the agent's alone: its forkserver and worker (forks of it, its argv and
    # environment) train on to the save; held as the agent was they died at once.
    under = torchagent.descendants(int(pid1))
    assert len(under) >= 2 and all(torchagent.alive(pid) for pid in under), under
    got = C10dRendezvousBackend(store, "r").get_state()
    assert got is not None
    assert {n.addr for n in pickle.loads(got[0]).participants} == {"127.0.0.2", "127.0.0.3"}
    assert "worker stopped" not in staying.lines, staying.lines[-10:]
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    leaving.proc.wait(timeout=15)


def test_a_leave_that_sees_its_run_s_save_request_ends_though_the_launcher_hangs(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """The workers' hooks race the launcher's in a whole stop; a launcher going away under a
    leave's connection could hold the hook past torch's client timeouts (the pods outlived
    the test's 15 s). The save request on the shared volume, newer than the agent, says the
    run stops: the hook returns then, without the launcher. An older request (an earlier
    run's) does not."""
    port, tmp_path, procs = world
    request = tmp_path / "volume-request"
    request.touch()  # an earlier run's stop, a minute before this agent started (the
    earlier = time.time() - 60  # agent's start is read to 10 ms: not one made just after)
    os.utime(request, (earlier, earlier))
    leaving = start_agent(tmp_path, port, "127.0.0.2", first=True)
    procs.append(leaving.proc)
    leaving.wait_for("worker started", within=120)
    pid1 = first_process(leaving)
    silent = socket.socket()  # a launcher that takes the connection and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    leave = hook(pid1, tmp_path, f"127.0.0.1:{silent.getsockname()[1]}", str(request))
    procs.append(leave)  # type: ignore[arg-type]
    held = leaving.wait_for("leave: holding")
    with pytest.raises(subprocess.TimeoutExpired):  # the earlier request ends nothing
        leave.wait(timeout=3)
    os.utime(request)  # the launcher's preStop, now
    assert leave.wait(timeout=30) == 0
    leaving.wait_for("leave: nothing to leave: the whole run stops", after=held)
    silent.close()
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    leaving.proc.wait(timeout=15)


def test_a_launcher_not_answering_yet_is_not_taken_for_gone(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """On a busy node a launcher's name may not resolve or its connection not be answered
    within a probe's seconds: taken for gone, the leave returned at once, the agent ended
    outside the rendezvous and its peers' training failed, a restart used (the queued
    Torchrun test's preemption in CI). Only a refusal or a host that is no more is gone."""
    port, tmp_path, procs = world
    leaving = start_agent(tmp_path, port, "127.0.0.2", first=True)
    procs.append(leaving.proc)
    leaving.wait_for("worker started", within=120)
    pid1 = first_process(leaving)
    leave = hook(pid1, tmp_path, f"launcher.not-resolved-yet.invalid:{port}")
    procs.append(leave)  # type: ignore[arg-type]
    held = leaving.wait_for("leave: holding")
    assert leave.wait(timeout=60) == 1  # asked until its bound, then said so
    said = leaving.wait_for("leave: the launcher did not answer", after=held)
    assert not [x for x in leaving.lines[held:said] if "nothing to leave" in x]
    os.kill(int(pid1), signal.SIGTERM)
    leaving.proc.wait(timeout=15)


def test_a_leave_is_taken_though_the_hook_s_own_python_cannot_load_torch(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """On a busy node the hook's own import of torch's client outlasted its bound: a live
    launcher "did not answer", the agent ended outside the rendezvous and a planned change
    used a restart (three in one CI run). The held agent, which has torch loaded, asks for
    the leave: a hook that cannot load torch at all is still taken out at once, and its
    peer restarts its worker as a membership change into a round without it."""
    port, tmp_path, procs = world
    leaving, staying = two_agents(world)
    pid1 = first_process(leaving)
    assert subprocess.run([sys.executable, "-S", "-c", "import torch"]).returncode != 0
    leave = hook(pid1, tmp_path, f"127.0.0.1:{port}", python=(sys.executable, "-S"))
    procs.append(leave)  # type: ignore[arg-type]
    assert leave.wait(timeout=60) == 0
    said = leaving.wait_for("leave: taken out")
    assert "asked by the agent" in leaving.lines[said]
    staying.wait_for("worker stopped")
    backend = C10dRendezvousBackend(TCPStore("127.0.0.1", port, is_master=False), "r")
    deadline = time.monotonic() + 60
    while True:
        got = backend.get_state()
        assert got is not None
        state = pickle.loads(got[0])
        nodes = {n.addr for n in (*state.participants, *state.wait_list)}
        if "127.0.0.3" in nodes and "127.0.0.2" not in nodes:
            break
        assert time.monotonic() < deadline, f"not a round without the leaving node: {nodes}"
        time.sleep(0.05)
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    leaving.proc.wait(timeout=15)


def test_a_leave_returns_once_its_peers_stopped_their_training(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """The leaving node's training goes when its hook returns (the kubelet's SIGTERM follows):
    peers still training then fail their collective, and a planned change uses a restart (a
    preemption notice in CI, its peer's agent slow to look on a busy node). The hook returns
    once every peer stopped its training for the membership change, however late it looks."""
    port, tmp_path, procs = world
    leaving = start_agent(tmp_path, port, "127.0.0.2", first=True)
    staying = start_agent(tmp_path, port, "127.0.0.3", first=False, monitor=3.0)
    procs += [leaving.proc, staying.proc]
    leaving.wait_for("worker started", within=120)
    started = staying.lines[staying.wait_for("worker started", within=120)]
    worker = Path(f"/proc/{started.split()[-1]}")
    pid1 = first_process(leaving)
    leave = hook(pid1, tmp_path, f"127.0.0.1:{port}")
    procs.append(leave)  # type: ignore[arg-type]
    assert leave.wait(timeout=60) == 0
    assert not worker.exists(), "the hook returned while its peer still trained"
    said = leaving.lines[leaving.wait_for("leave: taken out")]
    assert "not taken out in time" not in said, said
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    leaving.proc.wait(timeout=15)


def test_a_leave_in_a_whole_stop_waits_for_the_save(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """All of a torchrun job's pods go at once in a whole stop: rank 0 saves at the end of
    its step once it sees the launcher's request, and a worker's SIGTERM (once its hook
    returns) cut that step short, its peers' perhaps gone: the stop saved nothing and the
    next run lost steps (CI). The hook returns once the save is reported, not before."""
    port, tmp_path, procs = world
    leaving = start_agent(tmp_path, port, "127.0.0.2", first=True)
    procs.append(leaving.proc)
    leaving.wait_for("worker started", within=120)
    pid1 = first_process(leaving)
    request, report = tmp_path / "save-request", tmp_path / "saved"
    report.touch()  # an earlier stop's report: not this stop's
    earlier = time.time() - 60
    os.utime(report, (earlier, earlier))
    request.touch()  # the launcher's preStop
    leave = hook(pid1, tmp_path, f"127.0.0.1:{port}", str(request), str(report))
    procs.append(leave)  # type: ignore[arg-type]
    held = leaving.wait_for("leave: nothing to leave: the whole run stops")
    with pytest.raises(subprocess.TimeoutExpired):  # no save yet: the hook waits
        leave.wait(timeout=3)
    report.write_text("step=7\n")  # rank 0's report
    assert leave.wait(timeout=30) == 0
    leaving.wait_for("leave: the training saved for the stop", after=held)
    os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does once the hook returned
    leaving.proc.wait(timeout=15)


def test_an_agent_held_in_a_call_to_a_gone_launcher_ends_at_sigterm(
    world: tuple[int, Path, list[subprocess.Popen[str]]],
) -> None:
    """A whole stop deletes the launcher; an agent whose main thread was then in a call to its
    store (a connect or a read that waits out the store's timeout) ran no Python handler for
    the kubelet's SIGTERM: its pod lived to the SIGKILL, 30 s on (CI). It ends within a few
    seconds, its worker stopped as a SIGTERM stops it."""
    port, tmp_path, procs = world
    (tmp_path / "discover").write_text("#!/bin/sh\necho a\n")  # one host: its round closes
    relay = Relay(port).restore()
    try:
        agent = start_agent(tmp_path, relay.port, "127.0.0.2", first=True)
        procs.append(agent.proc)
        agent.wait_for("worker started", within=120)
        pid1 = first_process(agent)
        relay.silent.set()
        assert relay.held.wait(timeout=30), "the agent made no call to its store"
        os.kill(int(pid1), signal.SIGTERM)  # as the kubelet does
        sent = time.monotonic()
        agent.proc.wait(timeout=20)
        took = time.monotonic() - sent
        assert took < 12, f"the agent ended {took:.1f} s after its SIGTERM: {agent.lines[-12:]}"
        assert "worker stopped" in agent.lines, agent.lines[-10:]
    finally:
        relay.cut()
