"""The save handshake, a training script's side (docs/behaviour.md, "A save before every
stop"). Before any stop of a run (a suspension, an eviction, a launcher restart, the job
deleted) the launcher's preStop touches a request in the checkpoint directory and waits up to
20 s for a report; the job's status.lastSaved then shows the step saved and when. A script
honours it in three lines (rank 0 only):

    requests = SaveRequests(checkpoint_dir)          # at start
    if requests.asked():                              # once a step
        save(...); requests.report(step); hold()      # the stop comes within moments

Nothing of this is needed for ScaleOut, ScaleIn or a lost worker: every rank holds the state.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable

REQUEST, REPORT, MARKER = ".etoperator-save-request", ".etoperator-saved", ".etoperator-saves"


class SaveRequests:
    """Rank 0's side: `asked()` is one stat a step; `report(step)` once the save is whole."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.seen = self._requested()  # a request of an earlier run is not this run's
        if directory:
            os.makedirs(directory, exist_ok=True)
            open(os.path.join(directory, MARKER), "a").close()  # "this script saves when asked"

    def _requested(self) -> int:
        try:
            return os.stat(os.path.join(self.directory, REQUEST)).st_mtime_ns
        except OSError:
            return 0

    def asked(self) -> bool:
        if not self.directory:
            return False
        now = self._requested()
        if now > self.seen:
            self.seen = now
            return True
        return False

    def report(self, step: int) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "w") as f:
                f.write(f"step={step} t={time.time():.3f}\n")

        write_whole(os.path.join(self.directory, REPORT), write)


HOLD_MOST = 60.0  # seconds: a stop comes within the launcher's grace period (30 s) of its ask


def hold(most: float = HOLD_MOST) -> None:
    """Saved for a stop: train no further (a step now would be lost) until it comes. A request
    no stop follows (a file touched by hand, a hook cut short) holds the run `most` seconds,
    then training goes on: it costs a pause, never a run that hangs."""
    end = time.monotonic() + most
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))


def write_whole(path: str, write: Callable[[str], None]) -> None:
    """`write(tmp)`, then `tmp` renamed to `path`: a reader sees the old file or the new one.

    A SIGTERM meanwhile is handled once the rename is done: a stop's handler saves too, and
    a save begun in it would write into this one's file. The temporary name is unique on a
    shared volume, where processes of other pods have the same pids."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    os.close(fd)
    deferred: list[int] = []
    main = threading.current_thread() is threading.main_thread()  # where handlers may be set
    handler = signal.getsignal(signal.SIGTERM) if main else None
    if main:
        signal.signal(signal.SIGTERM, lambda n, _f: deferred.append(n))
        handler = signal.SIG_DFL if handler is None else handler  # one not set from Python
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if main:
            signal.signal(signal.SIGTERM, handler)
    if deferred and callable(handler):
        handler(deferred[0], None)
    elif deferred and handler == signal.SIG_DFL:
        signal.raise_signal(signal.SIGTERM)  # no handler: the stop ends the process, as it would
