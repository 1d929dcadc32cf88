"""Child processes of a local cluster: started in their own session, tied to our lifetime."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child: the kernel SIGKILLs it when the process that started it dies, so a killed
    test run or demo never leaves an apiserver or an sshd behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# The kernel's CPU weight of each nice level 0..19 (sched_prio_to_weight): a cgroup's cpu.shares
# that weighs as much as a process at that nice.
NICE_WEIGHTS = (
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip


def yield_cpu(nice: int) -> None:
    """In the child, in its new session: `nice` more than its parent's for it and its threads,
    and the same for its session's scheduling group where the kernel groups by session
    (autogroup): there a thread's nice counts only within its own session, so the inherited
    nice alone would leave a niced run's apiserver the equal of every other session."""
    level = os.nice(nice)
    group = Path("/proc/self/autogroup")
    if level > 0 and group.exists():
        group.write_text(str(level))


def weigh_as_self(cgroup: Path, processes: int = 1) -> None:
    """A cpu cgroup of ours (a node's root: all its pods) weighs what this process does, or
    `processes` like it: a cluster started by a niced run yields to the others as its
    processes do."""
    shares = cgroup / "cpu.shares"
    if shares.exists():
        shares.write_text(str(processes * NICE_WEIGHTS[max(0, min(os.nice(0), 19))]))


@contextlib.contextmanager
def cpus_of_their_own(name: str, cpus: int) -> Iterator[Callable[[], None]]:
    """A cpu cgroup weighing as `cpus` processes at this process's nice, for a run of that many
    busy processes on this machine (a training's ranks): grouped by session, they would weigh
    as one. Yields what a child runs to join it (nothing where cgroups v1 are not ours)."""
    group = Path("/sys/fs/cgroup/cpu") / f"etoperator-{name}-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        weigh_as_self(group, cpus)
    except OSError:
        with contextlib.suppress(OSError):  # made, then not weighed: left behind by nothing
            group.rmdir()
        yield lambda: None
        return

    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    try:
        yield join
    finally:
        with contextlib.suppress(OSError):  # what outlived the run goes back to the root group
            for pid in (group / "cgroup.procs").read_text().split():
                (group.parent / "cgroup.procs").write_text(pid)
            group.rmdir()


# The local clusters' Go daemons (apiserver, etcd, controllers, kubelets, containerd, CoreDNS,
# Kueue) spend nearly half of a test run's CPU (700 of 1490 core-seconds seen; apiservers 340),
# and at Go's default (GOGC=100) a good part of it collecting garbage. This machine has memory
# to spare and CPU to save: they collect at 5x their live heap instead of 2x, and more often
# once a heap nears 4 GiB (above twice any live heap seen here: the benchmarks' apiserver with
# thousands of pods stays bounded). What the caller set is kept.
GO_GC = {"GOGC": "400", "GOMEMLIMIT": "4GiB"}


def go_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (else this process's) with Go's collector set as GO_GC says, unless already set."""
    return {**GO_GC, **(os.environ if env is None else env)}


def spawn(
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    nice: int = 0,
    stdin: int = subprocess.DEVNULL,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """`argv` in a session of its own, output to `log`, at this process's CPU priority lowered
    by `nice`; its stdin nothing, or with `stdin=subprocess.PIPE` the caller's to write; the
    caller's `pass_fds` open in it."""

    def prepare() -> None:
        die_with_parent()
        yield_cpu(nice)

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=prepare,
            pass_fds=tuple(pass_fds),
        )


class Process(Protocol):
    """A process we can signal and wait for: a child (Popen) or another's (forkserver.Forked)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def stop(proc: Process | None, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it after `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:  # no such group: the process alone, if it is still there
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def paused(proc: Process) -> Iterator[None]:
    """`proc` stopped, not ended, meanwhile (SIGSTOP, then SIGCONT): what it keeps up to date
    lags, as a loaded or hung daemon's does."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def built(script: Path, *args: str) -> Path:
    """Run one of hack/'s build scripts (each builds once and caches) and return the path it
    prints on its last line."""
    out = subprocess.run([str(script), *args], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class StartError(RuntimeError):
    """A component did not come up; the message says which and ends with its log."""


def wait_until(
    ready: Callable[[], bool],
    what: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise StartError(f"{what} exited with code {proc.returncode}{_tail(log)}")
        if time.monotonic() > deadline:
            raise StartError(f"{what} not ready after {timeout:.0f}s{_tail(log)}")
        time.sleep(0.1)


def _tail(log: Path | None, n: int = 25) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-n:]
    return "\n--- " + str(log) + " ---\n" + "\n".join(lines)
