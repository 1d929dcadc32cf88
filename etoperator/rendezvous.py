"""The rendezvous of a torchrun job: torch's c10d store, held by the job's launcher pod.

Not imported by the operator: its source is shipped in the job's ConfigMap and run with the
job's own image (it needs torch, which the workers' image has) in two ways:

- `serve PORT RUN_ID MIN DISCOVER`: the launcher. It hosts the TCPStore every agent meets at
  (`--rdzv-backend=c10d`), so a ScaleIn can never take the rendezvous away with a worker, and
  it conducts: a worker that leaves on purpose is taken out of the rendezvous at once (its
  agent frozen first), the others are told through torch's own "nodes waiting" count so that
  they restart their workers as a membership change (which does not use up --max-restarts),
  and a round is closed as soon as it holds as many nodes as the host list (DISCOVER prints
  it), not after torch's 30 s last call. Its exit is the run's: 0 once every agent passed
  torch's exit barrier, 1 when the rendezvous closed without it (an agent gave up).
- `agent TORCHRUN-ARGS`: a worker's torchrun (its own parser, launch and agent), but its
  worker processes are forked from a process that imported torch once (multiprocessing's
  forkserver; the script run as `python script.py` runs it): a restart at a membership change
  then costs no new Python and no torch import, the most of a restart on a busy node. A
  command that asks for a start method, a module or no Python is torchrun's as it is.
- `leave`: a worker's preStop. It stops its own agent where it stands (neither failing its
  workers nor joining another round), asks the launcher to take it out, waits for that, then
  ends the agent with SIGTERM (torch then leaves the rendezvous open for the others).

State edits go through torch's own backend with its compare-and-set token, as its agents'
do; a lost race is tried again at the next tick.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

TICK = 0.1  # seconds between looks at the rendezvous (torchrun's agents look as often)
LEAVES = "etoperator/leaves"  # a counter; leave n is at etoperator/leave/<n>
LEAVE = "etoperator/leave/"
LEFT = "etoperator/left/"
LEAVE_WAIT = 10.0  # seconds a leaving worker waits for the launcher before going anyway
MARKER_ADDR = "etoperator.planned-change"
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
    settings: Any = _Settings(len(state.participants) + 1)
    _remove_participant_epilogue(state, settings)
    if was_complete and state.complete and state.participants:
        state.wait_list.add(marker())
        state.last_heartbeats[marker()] = datetime.now(UTC)
    return True


class _Settings:
    """What torch's epilogue reads of the settings: min_nodes (a round already complete is
    only moved on when empty, so any number serves there)."""

    def __init__(self, min_nodes: int) -> None:
        self.min_nodes = min_nodes


def tidy(
    state: Any, marked_round: int | None, hosts: Callable[[], int], min_nodes: int
) -> tuple[bool, bool]:
    """(state changed, marker still out). The marker goes once its round moved on; a round
    holding as many nodes as the host list closes now. `hosts` is asked only for a round
    that may close (a process a tick otherwise)."""
    changed = False
    out = marker() in state.wait_list
    if out and (marked_round is None or state.round != marked_round or not state.complete):
        state.wait_list.discard(marker())
        state.last_heartbeats.pop(marker(), None)
        changed, out = True, False
    now = datetime.now(UTC)
    count = len(state.participants)
    if (
        not out
        and not state.complete
        and state.deadline is not None
        and count >= max(min_nodes, 1)
        and state.deadline > now
        and count == hosts()
    ):
        state.deadline = now - timedelta(microseconds=1)
        changed = True
    return changed, out


def count_hosts(discover: str) -> int:
    try:
        out = subprocess.run([discover], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.splitlines() if line.strip()])


def serve(port: int, run_id: str, min_nodes: int, discover: str) -> int:
    """DISCOVER "-": the store alone, torch left to its own timeouts (a job that asks for
    torchrun as it is; the benchmarks' baseline)."""
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False)
    backend = C10dRendezvousBackend(store, run_id)
    print(f"rendezvous {run_id} serving on port {port}", flush=True)
    seen, marked, said = 0, None, ""
    while True:
        time.sleep(TICK)
        got = backend.get_state()
        if got is None:
            continue
        state, token = pickle.loads(got[0]), got[1]
        total = store.add(LEAVES, 0)
        leaving = [store.get(f"{LEAVE}{n}").decode() for n in range(seen + 1, total + 1)]
        changed = False
        for addr in leaving:
            if drop_nodes(state, addr):
                changed, marked = True, state.round
        hosts = partial(count_hosts, discover)
        tidied = discover != "-" and tidy(state, marked, hosts, min_nodes)[0]
        written = backend.set_state(pickle.dumps(state), token) if changed or tidied else None
        if (changed or tidied) and not (written and written[2]):
            continue  # an agent wrote first: look again
        for addr in leaving:
            store.set(f"{LEFT}{addr}", "1")
        seen = total
        now = describe(state)
        if now != said:
            print(now, flush=True)
            said = now
        if state.closed:
            passed = store.check([f"torch.rendezvous.{run_id}.{state.round}/{BARRIER}"])
            print(f"rendezvous closed; exit barrier {'passed' if passed else 'not passed'}")
            return 0 if passed else 1


def describe(state: Any) -> str:
    nodes = ",".join(sorted(n.addr for n in state.participants))
    what = "complete" if state.complete else "forming"
    said = f"round {state.round} {what}: {len(state.participants)} nodes [{nodes}]"
    waiting = sorted(n.addr for n in state.wait_list)
    return f"{said}, waiting [{','.join(waiting)}]" if waiting else said


def agents(addr: str) -> list[int]:
    """The pids of torchrun's agents of `addr` (not their workers, not us): in a worker's
    container, its one agent."""
    found = []
    mine = f"PET_LOCAL_ADDR={addr}".encode()
    ours = [os.path.abspath(__file__).encode(), b"agent"]  # our agent's argv[1:3]
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
        torchrun = any(a.endswith(b"torchrun") or a == b"torch.distributed.run" for a in argv[:3])
        if (argv[1:3] == ours or torchrun) and mine in env:
            found.append(int(entry))
    return found


def leave() -> int:
    from torch._C._distributed_c10d import TCPStore

    host, _, port = os.environ["PET_RDZV_ENDPOINT"].rpartition(":")
    addr = os.environ["PET_LOCAL_ADDR"]
    pids = agents(addr)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
        n = store.add(LEAVES, 1)
        store.set(f"{LEAVE}{n}", addr)
        deadline = time.monotonic() + LEAVE_WAIT
        while time.monotonic() < deadline and not store.check([f"{LEFT}{addr}"]):
            time.sleep(TICK)
    finally:
        for pid in pids:  # SIGTERM before SIGCONT: the agent wakes to it, not to its round
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)
    return 0


PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "numpy")
AS_IT_IS = ("--start-method", "--start_method", "--run-path", "--run_path", "--no-python",
            "--no_python", "-m", "--module")  # fmt: skip


def agent(argv: list[str]) -> int:
    import multiprocessing
    import multiprocessing.forkserver

    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import record

    args = run.get_args_parser().parse_args(argv)
    options = argv[: len(argv) - len(args.training_script_args)]
    forked = not any(o.split("=", 1)[0] in AS_IT_IS for o in options)
    if forked and "PET_START_METHOD" not in os.environ and "PET_RUN_PATH" not in os.environ:
        args.run_path, args.start_method = True, "forkserver"
        run.run_script_path = run_script  # what torchrun runs for --run-path
        if (
            "OMP_NUM_THREADS" not in os.environ
            and run.determine_local_world_size(args.nproc_per_node) > 1
        ):  # as torchrun sets it, but before torch is loaded where the workers fork from
            os.environ["OMP_NUM_THREADS"] = "1"
        multiprocessing.set_forkserver_preload(["__main__", *PRELOAD])
        multiprocessing.forkserver.ensure_running()  # torch imported while the round forms
    record(run.run)(args)
    return 0


def run_script(training_script: str, *training_script_args: str) -> None:
    """A worker process: the script as `python -u path args` runs it. Its sys.exit(0) is a
    return (torch's agent waits for the function's return value)."""
    import io
    import runpy

    path = training_script
    sys.argv = [path, *training_script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(write_through=True)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as end:
        if end.code not in (None, 0):
            raise


def stop(signum: int, _frame: object) -> None:
    """As a container's first process the server gets no default action for SIGTERM: without
    this it would hold its pod for the whole grace period (30 s of every suspend)."""
    sys.exit(128 + signum)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 5:
        signal.signal(signal.SIGTERM, stop)
        return serve(int(argv[1]), argv[2], int(argv[3]), argv[4])
    if argv == ["leave"]:
        return leave()
    if argv[:1] == ["agent"]:
        return agent(argv[1:])
    usage = "usage: rendezvous.py serve PORT RUN_ID MIN DISCOVER | agent ARGS | leave"
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
