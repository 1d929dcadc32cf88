"""A torchrun job's worker: torchrun's own parser, launch and agent, run from the job's
ConfigMap with the job's image (`torchagent.py TORCHRUN-ARGS`), with these differences:

- its worker processes fork from a forkserver, itself a fork of the agent after torch loaded
  (the script run as `python script.py` runs it): a restart at a membership change then costs
  no new Python and no torch import, the most of a restart on a busy node, and a pod's start
  one import of torch. A start method, a module or no Python asked for: torchrun as it is;
- it holds where it stands at HOLD, which the worker's leave (leave.py) sends: as its
  container's first process it gets no SIGSTOP sent from inside. A thread of it asks the
  launcher to take its node out when the leave hands it the ask (torch is loaded here, the
  hook's own Python would import it);
- a waiting agent looks at its forming round every LOOK_EVERY seconds, not every second;
- its workers' process groups are never torn down (HELD): torch's teardown can hang a worker
  at its script's end;
- it ends within seconds of a SIGTERM though its main thread is held in a call to the store
  (a launcher gone in a whole stop), where a Python handler would wait for the call's timeout
  and its pod for the kubelet's SIGKILL. docs/torchrun.md.

Not imported by the operator."""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import multiprocessing.util
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

HOLD = signal.SIGUSR2  # SIGUSR1 is a common preemption signal
# Seconds between a waiting agent's looks at its forming round (torch: 1). The launcher closes
# a round the moment it holds the host list; each agent saw that up to a second later, at
# every membership change. A look is one read of the round's state from the launcher's store.
LOOK_EVERY = 0.2
HANDLED_WITHIN = 5.0  # s for the main thread to run its SIGTERM handler, then the watch ends it
WORKERS_END_WITHIN = 10.0  # s for the workers to end at the watch's SIGTERM (within 30 s)
handled = threading.Event()  # a SIGTERM handler of the main thread ran


LEAVE = "leave.py"  # the leave's side, beside this file


def hold(_signum: int, _frame: object) -> None:
    """The leave's hold: the main thread parked until SIGTERM raises out (heartbeats go on)."""
    while True:
        time.sleep(3600)


def ended(signum: int, _frame: object) -> None:
    """SIGTERM before torch's agent set its own handler (it does once workers start): as its
    container's first process the agent would ignore it and hold its pod to the SIGKILL."""
    handled.set()
    try:
        from torch.distributed.elastic.multiprocessing import SignalException
    except ImportError:  # torch still loading
        raise SystemExit(128 + signum) from None
    raise SignalException(f"Process {os.getpid()} got signal: {signum}", signal.Signals(signum))


# torch._dynamo: any optimizer's construction imports it (1.1-1.7 s here); imported in each
# worker it was most of a restart after the round formed (every rank joined, DDP ready 1.7 s
# later), at every membership change.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "numpy")
AS_IT_IS = ("--start-method", "--start_method", "--run-path", "--run_path", "--no-python",
            "--no_python", "-m", "--module")  # fmt: skip


def agent(argv: list[str]) -> int:
    signal.signal(HOLD, hold)  # first: a leave may come while torch loads
    signal.signal(signal.SIGTERM, ended)
    with unswept():
        from torch.distributed import run
        from torch.distributed.elastic.multiprocessing.errors import record

    args = run.get_args_parser().parse_args(argv)
    options = argv[: len(argv) - len(args.training_script_args)]
    forked = not any(o.split("=", 1)[0] in AS_IT_IS for o in options)
    if forked and "PET_START_METHOD" not in os.environ and "PET_RUN_PATH" not in os.environ:
        fork_workers(args)  # before any thread of ours: the forkserver is a fork of this process
    watch_sigterm()
    flag_torch_handler()
    look_often()
    watcher = sibling().answer_leaves  # asks for the leave, torch loaded
    threading.Thread(target=watcher, name="etoperator-leave", daemon=True).start()
    record(run.run)(args)
    return 0


@contextlib.contextmanager
def unswept() -> Iterator[None]:
    """Imports of torch with Python's cycle collector off, what they made then frozen out of its
    sweeps (and of later processes' forked from here): sweeps were a third of an import of
    torch's elastic parts (3.5 -> 2.3 CPU-s here), and a pod's start is mostly imports."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def watch_sigterm() -> None:
    """A thread that sees SIGTERM as it comes (the wakeup fd), where a handler runs only once
    the main thread is back from a call in C."""
    read, write = socket.socketpair()
    write.setblocking(False)
    signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    threading.Thread(target=ending, args=(read, write), name="etoperator-sigterm",
                     daemon=True).start()  # fmt: skip


def ending(read: socket.socket, _write: socket.socket) -> None:  # _write: kept open
    while signal.SIGTERM not in read.recv(64):
        pass
    if handled.wait(HANDLED_WITHIN):
        return  # torch's handler stops the workers and ends the agent
    print(f"agent: no SIGTERM handler ran within {HANDLED_WITHIN:.0f} s (the main thread held "
          "in a call): the workers end and the agent with them", flush=True)  # fmt: skip
    ours = [pid for pid in descendants(os.getpid()) if not ignores_sigterm(pid)]
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + WORKERS_END_WITHIN
    while time.monotonic() < deadline and any(alive(pid) for pid in ours):
        time.sleep(0.1)
    with contextlib.suppress(Exception):  # as exit would: the semaphores named in /dev/shm
        multiprocessing.util._run_finalizers(0)  # type: ignore[attr-defined]
    os._exit(128 + signal.SIGTERM)


def descendants(root: int) -> list[int]:
    """Every process under `root` (the forkserver and the workers it forked)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/stat") as f:
            parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])  # after the name
    found, todo = list[int](), [root]
    while todo:
        parent = todo.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        todo += children
    return found


def ignores_sigterm(pid: int) -> bool:
    """Not to be waited for (multiprocessing's resource tracker: it ends with its users)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return True
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def alive(pid: int) -> bool:
    """Not ended and not a zombie (a worker's parent, the forkserver, reaps it late or never)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def flag_torch_handler() -> None:
    """torch's agent sets its own handler of SIGTERM (and SIGINT, SIGHUP, SIGQUIT) as its
    workers start: it flags `handled` at a SIGTERM."""
    from torch.distributed.elastic.multiprocessing import api

    terminate = api._terminate_process_handler

    def flagged(signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM:
            handled.set()
        terminate(signum, frame)

    api._terminate_process_handler = flagged


def look_often() -> None:
    """torch's rendezvous waits a second between looks at a round it waits on (its only
    delay of one second); LOOK_EVERY instead."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    from torch.distributed.elastic.rendezvous.utils import _delay

    def shorter(seconds: float | tuple[float, float]) -> None:
        _delay(LOOK_EVERY if seconds == 1 else seconds)

    rdzv._delay = shorter  # type: ignore[attr-defined]  # the name it calls


def sibling() -> Any:
    """leave.py, beside this file as the ConfigMap's keys are (stdlib until asked)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LEAVE)
    spec = importlib.util.spec_from_file_location("etoperator_leave", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fork_workers(args: Any) -> None:
    """Workers forked from a forkserver that imported torch, each running the script."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing import api

    args.run_path, args.start_method = True, "forkserver"
    run.run_script_path = run_script  # what torchrun runs for --run-path
    close = api.MultiprocessContext._close

    def closing(self: Any, death_sig: signal.Signals, timeout: int = 30) -> None:
        # A worker that answers the stop's SIGTERM with sys.exit(0) returns, and torch's
        # worker then waits for its value to be read, which a stop never does: 30 s, SIGKILL.
        self._worker_finished_event.set()
        close(self, death_sig, timeout)

    api.MultiprocessContext._close = closing  # type: ignore[method-assign]
    fork_server()


def fork_server() -> None:
    """multiprocessing's forkserver, forked from this process where torch is loaded, not
    spawned as a new Python that imported torch again (about 3 CPU-s a pod start here). It
    loads the rest (PRELOAD) while the round forms; its workers take the thread count a new
    process would (run_script)."""
    from multiprocessing import connection, forkserver

    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when every holder of alive_w has
        pid = os.fork()
        if pid == 0:  # the server: the signals a new process has, never the agent's exit
            try:
                os.close(alive_w)
                for sig in (signal.SIGTERM, HOLD):
                    signal.signal(sig, signal.SIG_DFL)
                with unswept():
                    for name in PRELOAD:
                        importlib.import_module(name)
                forkserver.main(listener.fileno(), alive_r, list(PRELOAD))
            finally:
                os._exit(0)
    os.close(alive_r)
    server: Any = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid = pid


# A worker's process groups, kept from the script's destroy_process_group until the worker
# ends (by os._exit: nothing torn down). Torch's teardown of a group's last reference (most
# often a DDP model's reducer, freed as the script's main() returns) holds the GIL while it
# waits for gloo's threads, one of which may need the GIL to release the last step's work:
# the worker hung for ever, its job Running after its last step (8 runs of 30 here).
HELD: list[Any] = []


def hold_process_groups() -> None:
    """destroy_process_group as torch's, that keeps what it destroys: shut down, not freed."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    destroy = c10d.destroy_process_group

    def destroy_held(group: Any = None) -> None:
        whole = group is None or group is c10d.GroupMember.WORLD
        HELD.extend(list(c10d._world.pg_map) if whole else [group])
        destroy(group)

    dist.destroy_process_group = c10d.destroy_process_group = destroy_held


def run_script(training_script: str, *training_script_args: str) -> None:
    """A worker process: the script as `python -u path args` runs it. Its sys.exit(0) is a
    return (torch's agent waits for the function's return value)."""
    import io
    import runpy

    import torch

    hold_process_groups()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # torchrun's, or the user's: read by OpenMP
        torch.set_num_threads(int(threads))  # at its load, in the agent that forked this one
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


if __name__ == "__main__":
    sys.exit(agent(sys.argv[1:]))
