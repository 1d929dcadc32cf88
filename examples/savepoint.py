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
import time

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
        """Written whole (a reader sees the old report or the new one)."""
        path = os.path.join(self.directory, REPORT)
        with open(f"{path}.tmp", "w") as f:
            f.write(f"step={step} t={time.time():.3f}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(f"{path}.tmp", path)


def hold() -> None:
    """Saved for a stop: train no further (a step now would be lost), until it comes."""
    while True:
        time.sleep(1)
