"""The rendezvous of a torchrun job: torch's c10d store, held by the job's launcher pod.

Not imported by the operator: its source is shipped in the job's ConfigMap and run with the
job's own image (it needs torch, which the workers' image has) in two ways (docs/torchrun.md):

- `serve PORT RUN_ID MIN DISCOVER [REQUEST]`: the launcher. It hosts the TCPStore every agent
  meets at, so a ScaleIn never takes the rendezvous away, and it conducts: a worker leaving on
  purpose is taken out at once (its agent held first) and the others told through torch's own
  "nodes waiting" count (a membership change: no --max-restarts used); its hook hears so once
  they stopped their training, which its own would fail if it went first; a round closes as soon
  as it holds as many nodes as the host list (DISCOVER prints it), not after torch's 30 s last
  call. Once the save handshake's REQUEST is touched the run stops: leaves change nothing.
  Its exit is the run's: 0 once every agent passed torch's exit barrier, else 1.
- `leave [REQUEST]`: a worker's preStop. It holds its own agent (torchagent.py: HOLD;
  torchrun as it is: SIGSTOP), asks the launcher to take it out and waits; the kubelet's
  SIGTERM then ends the agent. A save REQUEST newer than the agent: the whole run stops, and
  there is nothing to leave. Its lines go to the container's log.
State edits go through torch's backend with its compare-and-set token, as its agents' do."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any

TICK = 0.1  # seconds between looks at the rendezvous (torchrun's agents look as often)
LEAVES = "etoperator/leaves"  # a counter; leave n is at etoperator/leave/<n>
LEAVE = "etoperator/leave/"
LEFT = "etoperator/left/"
STOPPING = "etoperator/stopping"  # set once the run stops: a leave then changes nothing
STOP_HOLD = 60.0  # seconds a save request holds the run (examples/savepoint.py HOLD_MOST)
LEAVE_WAIT = 10.0  # seconds a leaving worker waits for the launcher before going anyway
HANDED = 5.0  # seconds the hook waits for its agent's own ask before it asks too
MARKER_ADDR = "etoperator.planned-change"
HOLD = signal.SIGUSR2  # our agent holds at it (torchagent.HOLD)
AGENT = "torchagent.py"  # our agent, beside this file
BARRIER = "torchelastic/agent/terminal_state/last_member"  # torch's exit barrier, once passed


def marker() -> Any:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    return _NodeDesc(MARKER_ADDR, 0, 0)


def drop_nodes(state: Any, addr: str) -> bool:
    """Takes every node of `addr` out of the rendezvous state, as torch's own sweep of dead
    nodes does; if a running round had others, a marker waits so that they restart."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _remove_participant_epilogue,
    )

    gone = {n for n in (*state.participants, *state.wait_list, *state.last_heartbeats)}
    gone = {n for n in gone if n.addr == addr}
    if not gone:
        return False
    was_complete = state.complete
    for node in gone:
        state.participants.pop(node, None)
        state.last_heartbeats.pop(node, None)
        state.wait_list.discard(node)
        state.redundancy_list.discard(node)
    # what torch's epilogue reads: min_nodes (a complete round only moves on when empty)
    settings: Any = SimpleNamespace(min_nodes=len(state.participants) + 1)
    _remove_participant_epilogue(state, settings)
    if was_complete and state.complete and state.participants:
        state.wait_list.add(marker())
        state.last_heartbeats[marker()] = datetime.now(UTC)
    return True


def tidy(
    state: Any, marked_round: int | None, hosts: Callable[[], int], min_nodes: int
) -> tuple[bool, bool]:
    """(state changed, marker still out). The marker goes once its round moved on; a round as
    big as the host list closes now (`hosts`, a process, asked only for one that may close)."""
    changed = False
    out = marker() in state.wait_list
    if out and (marked_round is None or state.round != marked_round or not state.complete):
        state.wait_list.discard(marker())
        state.last_heartbeats.pop(marker(), None)
        changed, out = True, False
    now = datetime.now(UTC)
    count = len(state.participants)
    forming = not out and not state.complete and state.deadline is not None
    if forming and count >= max(min_nodes, 1) and state.deadline > now and count == hosts():
        state.deadline = now - timedelta(microseconds=1)
        changed = True
    return changed, out


def count_hosts(discover: str) -> int:
    try:
        out = subprocess.run([discover], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.splitlines() if line.strip()])


def serve(port: int, run_id: str, min_nodes: int, discover: str, request: str = "-") -> int:
    """DISCOVER "-": the store alone, torch's own timeouts (torchrun as it is). REQUEST: the
    save handshake's file, touched as the run stops; a leave then would restart the others."""
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d

    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False)
    backend = c10d.C10dRendezvousBackend(store, run_id)
    print(f"rendezvous {run_id} serving on port {port}", flush=True)
    seen, marked, said, started, stopping = 0, None, "", time.time(), False
    pending: dict[str, int | None] = {}  # a leaving node: the round its peers still train in
    while True:
        time.sleep(TICK)
        if stopping != stops(request, started):
            stopping = not stopping
            store.set(STOPPING, "1") if stopping else store.delete_key(STOPPING)
            print(f"the run stops: {stopping} (leaves change nothing then)", flush=True)
        got = None if stopping else backend.get_state()
        if got is None:
            continue
        state, token = pickle.loads(got[0]), got[1]
        total = store.add(LEAVES, 0)
        leaving = [store.get(f"{LEAVE}{n}").decode() for n in range(seen + 1, total + 1)]
        dropped = {addr: drop_nodes(state, addr) for addr in leaving}
        marked = state.round if any(dropped.values()) else marked
        hosts = partial(count_hosts, discover)
        tidied = discover != "-" and tidy(state, marked, hosts, min_nodes)[0]
        changed = any(dropped.values()) or tidied
        written = backend.set_state(pickle.dumps(state), token) if changed else None
        if changed and not (written and written[2]):
            continue  # an agent wrote first: look again
        others = state.complete and bool(state.participants)
        pending.update({a: state.round if d and others else None for a, d in dropped.items()})
        for addr in [a for a, r in pending.items() if r != state.round or not state.complete]:
            store.set(f"{LEFT}{addr}", "1")
            del pending[addr]
        seen = total
        now = describe(state)
        if now != said:
            print(now, flush=True)
            said = now
        if state.closed:
            passed = store.check([f"torch.rendezvous.{run_id}.{state.round}/{BARRIER}"])
            print(f"rendezvous closed; exit barrier {'passed' if passed else 'not passed'}")
            return 0 if passed else 1


def stops(request: str, started: float) -> bool:
    """Asked to save since it started; a request no stop followed (a file touched by hand)
    is over after STOP_HOLD s, as the script's hold is."""
    with contextlib.suppress(OSError):
        asked = os.stat(request).st_mtime if request != "-" else 0.0
        return started < asked > time.time() - STOP_HOLD
    return False


def describe(state: Any) -> str:
    nodes = ",".join(sorted(n.addr for n in state.participants))
    what = "complete" if state.complete else "forming"
    said = f"round {state.round} {what}: {len(state.participants)} nodes [{nodes}]"
    waiting = sorted(n.addr for n in state.wait_list)
    return f"{said}, waiting [{','.join(waiting)}]" if waiting else said


def agents(addr: str) -> tuple[list[int], list[int]]:
    """The pids of the agents of `addr` (not their workers, not us): ours, then torchrun's as
    it is. In a worker's container, its one agent."""
    ours, theirs = list[int](), list[int]()
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
        elif any(a.endswith(b"torchrun") or a == b"torch.distributed.run" for a in argv[:3]):
            theirs.append(int(entry))
    return ours, theirs


def say(line: str) -> None:
    """To the container's log: its first process's output (else ours, when run by hand)."""
    try:
        with open("/proc/1/fd/1", "a") as out:
            print(line, file=out, flush=True)
    except OSError:
        print(line, flush=True)


def leave(request: str = "-") -> int:
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
        said = bounded(ask, LEAVE_WAIT + 10, partial(stops, request, begun))
        say(f"leave: {said} after {time.monotonic() - start:.1f} s")
    except Exception as failed:  # the launcher not answering: the agent still ends
        say(f"leave: the launcher did not answer ({type(failed).__name__}: {failed})")
        return 1
    finally:
        end_agents([p for p in ours + theirs if p != 1])
        say("leave: done; the agent ends at the kubelet's SIGTERM")
    return 0


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
        with open(asking(pid), "w") as f:
            f.write(endpoint)
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
        time.sleep(TICK)
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
    while not os.path.exists(path):
        time.sleep(TICK)
    start = time.monotonic()
    try:
        with open(path) as f:
            endpoint = f.read()
        said = f"ok {ask_to_leave(os.environ['PET_LOCAL_ADDR'], endpoint)}"
    except Exception as failed:
        said = f"failed {type(failed).__name__}: {failed}"
    with open(path + ".part", "w") as f:
        f.write(f"{said} (asked by the agent in {time.monotonic() - start:.1f} s)")
    os.replace(path + ".part", path + ".answer")


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
        with open(f"/proc/{pid}/stat") as f, open("/proc/uptime") as u:
            ticks, up = int(f.read().rsplit(")", 1)[1].split()[19]), float(u.read().split()[0])
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
        thread.join(TICK)
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
    n = store.add(LEAVES, 1)  # not read by a launcher whose run stops
    store.set(f"{LEAVE}{n}", addr)
    deadline = time.monotonic() + LEAVE_WAIT
    while time.monotonic() < deadline:
        if store.check([f"{LEFT}{addr}"]):
            return "taken out"
        if store.check([STOPPING]):
            return "nothing to leave: the whole run stops (its save handshake goes on)"
        time.sleep(TICK)
    return "not taken out in time"


def stop(signum: int, _frame: object) -> None:
    """A container's first process has no default SIGTERM action: it held its pod 30 s."""
    sys.exit(128 + signum)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) in (5, 6):
        signal.signal(signal.SIGTERM, stop)
        return serve(int(argv[1]), argv[2], int(argv[3]), *argv[4:])
    if argv[:1] == ["leave"] and len(argv) <= 2:  # no interpreter exit: an ask still in
        os._exit(leave(*argv[1:]))  # torch's C++ client (a thread) aborted it (SIGABRT)
    usage = "usage: rendezvous.py serve PORT RUN_ID MIN DISCOVER [REQUEST] | leave [REQUEST]"
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
