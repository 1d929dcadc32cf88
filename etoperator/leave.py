"""A torchrun worker's leave: its preStop (`leave.py [REQUEST [REPORT]]`) and its agent's side.

Not imported by the operator: shipped in the job's ConfigMap beside rendezvous.py (the
launcher, whose store keys and stop rule it shares) and run with the job's own image. The
hook holds its own agent (torchagent.py: HOLD; torchrun as it is: SIGSTOP), has the launcher
take its node out and waits for that; the kubelet's SIGTERM then ends the agent. A save
REQUEST newer than the agent: the whole run stops, there is nothing to leave, and the hook
waits for the training's save (its REPORT) instead. Its lines go to the container's log.
docs/torchrun.md says why each step is as it is."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

SAVE_WAIT = 20  # seconds a stop waits for the save (naming.SAVE_WAIT, the launcher's wait)
LEAVE_WAIT = 10.0  # seconds a leaving worker waits for the launcher before going anyway
HANDED = 5.0  # seconds the hook waits for its agent's own ask before it asks too
HOLD = signal.SIGUSR2  # our agent holds at it (torchagent.HOLD)
AGENT = "torchagent.py"  # our agent, beside this file
STOPS = "nothing to leave: the whole run stops (its save handshake goes on)"


def sibling(name: str) -> Any:
    """A file beside this one (as the ConfigMap's keys are), loaded by its path: the job's
    image has no operator package, and an `etoperator` in it could be of another version."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    spec = importlib.util.spec_from_file_location(f"etoperator_{name[:-3]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from etoperator import rendezvous as rdzv
else:
    rdzv = sibling("rendezvous.py")


def agents(addr: str) -> tuple[list[int], list[int]]:
    """The pids of the agents of `addr` (not their workers, not us): ours, then torchrun's as
    it is. In a worker's container, its one agent. Our agent's forkserver and workers are
    forks of it (its argv, its environment): of ours, only those whose parent is not."""
    ours, theirs, parents = list[int](), list[int](), dict[int, int]()
    mine = f"PET_LOCAL_ADDR={addr}".encode()
    our_argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), AGENT).encode()]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mine not in env:
            continue
        args = argv[1:]
        while args and args[0].startswith(b"-"):  # the interpreter's options (-u)
            args = args[1:]
        if args[:1] == our_argv:
            ours.append(int(entry))
            parents[int(entry)] = parent(int(entry))
        elif any(a.endswith(b"torchrun") or a == b"torch.distributed.run" for a in argv[:3]):
            theirs.append(int(entry))
    return [pid for pid in ours if parents[pid] not in parents], theirs


def parent(pid: int) -> int:
    try:
        return int(stat_fields(pid)[1])
    except (OSError, ValueError, IndexError):
        return 0


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the process's name (which may hold spaces), from its state on."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def say(line: str) -> None:
    """To the container's log: its first process's output (else ours, when run by hand)."""
    try:
        with open("/proc/1/fd/1", "a") as out:
            print(line, file=out, flush=True)
    except OSError:
        print(line, flush=True)


def leave(request: str = "-", report: str = "-") -> int:
    addr, endpoint = os.environ["PET_LOCAL_ADDR"], os.environ["PET_RDZV_ENDPOINT"]
    ours, theirs = agents(addr)
    asked = next((pid for pid in ours if hand_over(pid, endpoint)), None)  # one asks
    for pid in ours:
        os.kill(pid, HOLD)
    for pid in theirs:
        os.kill(pid, signal.SIGSTOP)
    say(f"leave: holding the agent of {addr} ({' '.join(map(str, ours + theirs)) or 'none'})")
    start = time.monotonic()
    begun = min(map(started, ours + theirs), default=time.time())
    handed = partial(answer_or_ask, asked) if asked is not None else None
    ask = partial(handed or ask_to_leave, addr, endpoint)
    try:  # a whole stop: the launcher's save request, seen here, ends the leave at once
        said = bounded(ask, LEAVE_WAIT + 10, partial(rdzv.stops, request, begun))
        say(f"leave: {said} after {time.monotonic() - start:.1f} s")
        if report != "-" and (said.startswith(STOPS) or rdzv.stops(request, begun)):
            say(f"leave: {saved(request, report, begun)} after {time.monotonic() - start:.1f} s")
    except Exception as failed:  # the launcher not answering: the agent still ends
        say(f"leave: the launcher did not answer ({type(failed).__name__}: {failed})")
        return 1
    finally:
        end_agents([p for p in ours + theirs if p != 1])
        say("leave: done; the agent ends at the kubelet's SIGTERM")
    return 0


def saved(request: str, report: str, begun: float) -> str:
    """A whole stop: rank 0 saves at the end of the step it is in (the request seen) and
    reports. The kubelet's SIGTERM, once this returns, cuts the training mid-step instead,
    its peers perhaps gone already: the stop saved nothing (lost steps in CI). So this waits
    for the request (the launcher, told its pod is being deleted, holds leaves before its
    preStop asks) and the report, at most SAVE_WAIT s each (the launcher's hook waits as long)."""
    deadline = time.monotonic() + SAVE_WAIT
    while not rdzv.stops(request, begun):
        if time.monotonic() > deadline:
            return f"no save asked within {SAVE_WAIT} s of the stop"
        time.sleep(rdzv.TICK)
    asked = os.stat(request).st_mtime_ns
    while time.time_ns() < asked + SAVE_WAIT * 10**9:
        with contextlib.suppress(OSError):  # the same coarse clock tick as the ask: a save
            if os.stat(report).st_mtime_ns >= asked:  # (an earlier stop's is older)
                return "the training saved for the stop"
        time.sleep(rdzv.TICK)
    return f"no save reported within {SAVE_WAIT} s of the ask"


def asking(pid: int) -> str:
    """Where a leave asks agent `pid` to ask for it; its answer is at this + ".answer"."""
    return os.path.join(tempfile.gettempdir(), f"etoperator-leave.{pid}")


def hand_over(pid: int, endpoint: str) -> bool:
    """Our agent asks the launcher itself (`answer_leaves`): torch is loaded there, while
    this hook would import it first (on a busy node longer than its bound). False: no watcher
    of this agent's (torch still loading, a read-only /tmp): the hook asks."""
    try:
        if os.stat(asking(pid) + ".ready").st_mtime < started(pid) - 1:
            return False  # an earlier agent's, whose pid this one has
        path = asking(pid)
        with open(path + ".part", "w") as f:  # whole when its watcher sees it
            f.write(endpoint)
        os.replace(path + ".part", path)
    except OSError:
        return False
    return True


def answer_or_ask(pid: int, addr: str, endpoint: str) -> str:
    """What agent `pid` said its ask came to; if it says nothing within HANDED seconds (its
    process starved), the hook asks too (bounded by the caller)."""
    deadline = time.monotonic() + HANDED
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            with open(asking(pid) + ".answer") as f:
                ok, _, said = f.read().partition(" ")
            if ok != "ok":
                raise RuntimeError(said)
            return said
        time.sleep(rdzv.TICK)
    return ask_to_leave(addr, endpoint) + " (asked by the hook: the agent did not answer)"


def answer_leaves() -> None:
    """Our agent's watcher (its thread, torch loaded): asks for the leave that hands it the
    ask, and writes what came of it. Not the hold's handler: the agent's main thread may be
    in a long call (a store wait of its round), running no handler until it returns."""
    path = asking(os.getpid())
    try:
        for stale in (path, path + ".answer"):  # a pid an earlier agent had (a shared /tmp)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        open(path + ".ready", "w").close()
    except OSError:
        return  # a read-only /tmp: no `.ready`, the hook asks itself
    endpoint = handed_endpoint(path)
    start = time.monotonic()
    try:
        said = f"ok {ask_to_leave(os.environ['PET_LOCAL_ADDR'], endpoint)}"
    except Exception as failed:
        said = f"failed {type(failed).__name__}: {failed}"
    with open(path + ".answer.part", "w") as f:
        f.write(f"{said} (asked by the agent in {time.monotonic() - start:.1f} s)")
    os.replace(path + ".answer.part", path + ".answer")


def handed_endpoint(path: str) -> str:
    """The endpoint a hook hands over at `path`, once written whole: a file seen between its
    open and its write is empty (its port read as int('') failed the leave)."""
    while True:
        with contextlib.suppress(FileNotFoundError), open(path) as f:
            if (endpoint := f.read()).rpartition(":")[2].isdigit():
                return endpoint
        time.sleep(rdzv.TICK)


def end_agents(pids: list[int]) -> None:
    """SIGTERM before SIGCONT: an agent wakes to it, not to its round. Never the container's
    first process: its end would cut this hook short (the kubelet's SIGTERM ends it after)."""
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)


def started(pid: int) -> float:
    """When process `pid` started (seconds since the epoch), from its start tick and the
    uptime (to 10 ms; /proc/stat's boot time is whole seconds); now if it has ended."""
    try:
        with open("/proc/uptime") as u:
            ticks, up = int(stat_fields(pid)[19]), float(u.read().split()[0])
    except OSError:
        return time.time()
    return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))


def bounded(ask: Callable[[], str], seconds: float, over: Callable[[], bool] = bool) -> str:
    """`ask()` in a thread given `seconds` (torch's client may wait on a launcher that took
    the connection and hangs for longer than its own timeout): its answer, or it raises;
    once `over()`, that the whole run stops."""
    got: list[str | Exception] = []

    def run() -> None:
        try:
            got.append(ask())
        except Exception as exc:
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < deadline and not over():
        thread.join(rdzv.TICK)
    if not got and over():
        return "nothing to leave: the whole run stops (its save request is there)"
    if not got:
        raise TimeoutError(f"no answer within {seconds:.0f} s")
    if isinstance(got[0], Exception):
        raise got[0]
    return got[0]


def gone(host: str, port: int) -> bool:
    """Nothing listens where the launcher was: refused (the pod ends, or the Service has no
    endpoint left) or no such host (the address of a pod deleted). A connection not answered
    yet or a name not resolved yet is a slow launcher on a busy node, never one gone."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except OSError as failed:
        return failed.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)


def ask_to_leave(addr: str, endpoint: str) -> str:
    """What became of asking the launcher at `endpoint` to take `addr` out."""
    host, port = endpoint.rpartition(":")[::2]
    went = "nothing to leave: the launcher is gone (the whole run stops)"
    if gone(host, int(port)):
        return went
    from torch._C._distributed_c10d import TCPStore  # a second or more on a busy node

    while True:  # bounded by the caller
        if gone(host, int(port)):  # it went meanwhile (a whole stop)
            return went
        with contextlib.suppress(RuntimeError):  # slow to answer: asked again
            store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
            break
    n = store.add(rdzv.LEAVES, 1)  # not read by a launcher whose run stops
    store.set(f"{rdzv.LEAVE}{n}", addr)
    deadline = time.monotonic() + LEAVE_WAIT
    while time.monotonic() < deadline:
        if store.check([f"{rdzv.LEFT}{addr}"]):
            return "taken out"
        if store.check([rdzv.STOPPING]):
            return STOPS
        time.sleep(rdzv.TICK)
    return "not taken out in time"


def main(argv: list[str]) -> int:
    if len(argv) <= 2:  # no interpreter exit: an ask still in torch's C++ client (a thread)
        os._exit(leave(*argv))  # aborted it (SIGABRT)
    print("usage: leave.py [REQUEST [REPORT]]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
