"""Scaler scripts: run on the launcher off the reconcile path, the outcome on the scaler."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from etoperator import naming
from etoperator.cache import Observed
from etoperator.clock import utcnow
from etoperator.kube import NO_ANSWER, Kube
from etoperator.planning import Plan
from etoperator.planning.scaling import SCRIPT_GRACE
from etoperator.planning.writes import ScriptCondition
from etoperator.reconcile.state import job_id

log = logging.getLogger(__name__)

# Run on the launcher as `sh -c RECORDED etoperator-script <record> <argv...>`: a fixed script;
# the scaler's values arrive as arguments, never parsed by it. The script runs in a subshell of
# its own, its output to a file: when the operator dies, the apiserver closes the exec stream
# and the runtime kills the exec's process (this wrapper), but the script runs on and records
# its exit code where the next operator reads it. Without a writable directory, it runs as is.
_DIR = 'd="${TMPDIR:-/tmp}"; [ -w "$d" ] || d=/dev/shm; d="$d/etoperator-scripts/$1"; '
RECORDED = (
    _DIR + 'shift; if mkdir -p "$d" 2>/dev/null && : > "$d/out" 2>/dev/null; then '
    '( "$@" > "$d/out" 2>&1 < /dev/null; c=$?; echo "$c" > "$d/exit.part"; '
    'mv "$d/exit.part" "$d/exit"; exit "$c" ) & echo $! > "$d/pid"; wait $!; c=$?; '
    'cat "$d/out"; exit "$c"; fi; "$@"'
)
# Prints `exit <code>` for a run that ended, `running` while it runs, `unknown` otherwise.
RECORD = (
    _DIR + 'if [ -f "$d/exit" ]; then echo "exit $(cat "$d/exit")"; '
    'elif [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then echo running; '
    "else echo unknown; fi"
)


@dataclass
class Scripts:
    """Scaler scripts in flight (a thread each) and those already reported."""

    kube: Kube
    report: Callable[[ScriptCondition], bool]  # the executor's: False when the scaler is gone
    clock: Callable[[], datetime] = utcnow
    _running: dict[str, threading.Thread] = field(default_factory=dict)
    # Scripts that ran and were reported: never run again for the same scaler, even by a pass
    # that read the scaler before the report landed.
    _done: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, prefix: str) -> None:
        with self._lock:
            self._done = {k for k in self._done if not k.startswith(prefix)}

    def run(self, obs: Observed, plan: Plan) -> None:
        """Scaler scripts, on the launcher, off the reconcile path: the job keeps being looked
        after while one runs, and its scaler waits for the ScriptExecuted condition. Each runs
        in a thread of its own (a job has one scaler at a time, so there are at most as many as
        jobs): a script that hangs for its whole timeout holds up no other job's."""
        meta = obs.job["metadata"]
        jid = job_id(meta["namespace"], meta["name"], meta["uid"])
        ns, job = meta["namespace"], meta["name"]
        for kind_name, argv, timeout, record in plan.run_scripts:
            self._start(f"{jid}/{kind_name[0]}/{kind_name[1]}", kind_name,
                        self.run_script, (ns, job, kind_name, argv, timeout, record))  # fmt: skip
        for kind_name, record, over in plan.check_scripts:
            self._start(f"{jid}/{kind_name[0]}/{kind_name[1]}", kind_name,
                        self.learn_outcome, (ns, job, kind_name, record, over))  # fmt: skip

    def _start(
        self,
        run: str,
        kind_name: tuple[str, str],
        target: Callable[..., None],
        args: tuple[Any, ...],
    ) -> None:
        """`target(*args, run)` in a thread of its own, unless one runs for that scaler already
        or its outcome was reported."""
        with self._lock:
            if run in self._running or run in self._done:
                return
            thread = threading.Thread(
                target=target, args=(*args, run), name=f"etoperator-script-{kind_name[1]}",
                daemon=True,
            )  # fmt: skip
            self._running[run] = thread
        thread.start()

    def learn_outcome(
        self, ns: str, job: str, kind_name: tuple[str, str], record: str, over: bool, run: str
    ) -> None:
        """A script marked started by an operator that did not see it end: its outcome, from
        the launcher's record. A run the launcher does not know (a new launcher, a record that
        could not be written) ends the wait once its timeout is over, said as such."""
        launcher = naming.launcher_name(job)
        try:
            said = self._recorded(ns, launcher, record)
            if said.isdigit():
                ended = int(said)
                message = f"script exited {ended} on {launcher} (its end read from the launcher)"
                self._report(kind_name, ns, ended == 0, message, run)
            elif said == "unknown" and over:
                message = (
                    f"the script's end on {launcher} is not known (the launcher keeps no record "
                    "of it) and its timeout is over"
                )
                self._report(kind_name, ns, False, message, run, reason="ScriptLost")
        except Exception:  # the next pass asks again
            log.exception("Scaler script outcome not read namespace=%s scaler=%s", ns, kind_name[1])
        finally:
            with self._lock:
                self._running.pop(run, None)

    def _report(
        self, kind_name: tuple[str, str], ns: str, ok: bool, message: str, run: str,
        reason: str = "",
    ) -> None:  # fmt: skip
        reason = reason or ("ScriptSucceeded" if ok else "ScriptFailed")
        if self.mark_script(kind_name, ns, "True" if ok else "False", reason, message):
            with self._lock:
                self._done.add(run)

    def run_script(
        self, ns: str, job: str, kind_name: tuple[str, str], argv: list[str], timeout: int,
        record: str, run: str,
    ) -> None:  # fmt: skip
        """Marked as started on the scaler first (an operator that restarts meanwhile does not
        start a second copy), then run under the recording wrapper; the outcome becomes the
        scaler's ScriptExecuted condition, and writing it wakes the job. An exec whose end was
        not told is looked up in the launcher's record."""
        launcher = naming.launcher_name(job)
        try:
            if not self.mark_script(
                kind_name, ns, "Unknown", "ScriptRunning", f"started on {launcher}"
            ):
                return  # the scaler is gone
            wrapped = ["sh", "-c", RECORDED, "etoperator-script", record, *argv]
            code, output = self.kube.exec_in_pod(ns, launcher, wrapped, timeout + SCRIPT_GRACE)
            lost = code == -1 and output.startswith(NO_ANSWER)
            if lost and self._recorded(ns, launcher, record) == "unknown":
                # The connection failed before any answer and the launcher never started it
                # (an apiserver restarting): once more, as it would have been.
                code, output = self.kube.exec_in_pod(ns, launcher, wrapped, timeout + SCRIPT_GRACE)
            log.info(
                "Scaler script ran namespace=%s scaler=%s exit_code=%s", ns, kind_name[1], code
            )
            log.debug("Scaler script output namespace=%s scaler=%s output=%r", ns, kind_name[1],
                      output[-2000:])  # fmt: skip
            if code == -1:
                said = self._recorded(ns, launcher, record)
                if said == "running":
                    return  # its end is read from the record by a later pass
                if said.isdigit():
                    code = int(said)
            message = f"script exited {code} on {launcher}"
            if code == -1:  # it never ran: say why
                why = output.removeprefix("could not run it: ")[:300]
                message = f"script did not run on {launcher}: {why}"
            self._report(kind_name, ns, code == 0, message, run)
        except Exception:  # a refused write: the next pass asks the record
            log.exception("Scaler script not reported namespace=%s scaler=%s", ns, kind_name[1])
        finally:
            with self._lock:
                self._running.pop(run, None)

    def _recorded(self, ns: str, launcher: str, record: str) -> str:
        """The run's exit code as the launcher recorded it, `running`, or `unknown`."""
        argv = ["sh", "-c", RECORD, "etoperator-script", record]
        code, out = self.kube.exec_in_pod(ns, launcher, argv, 10)
        said = out.strip().split()
        if code != 0 or not said:
            return "unknown"
        if said[0] == "exit" and len(said) == 2 and said[1].isdigit():
            return said[1]
        return said[0] if said[0] in ("running", "unknown") else "unknown"

    def mark_script(
        self, kind_name: tuple[str, str], ns: str, status: str, reason: str, message: str
    ) -> bool:
        """The ScriptExecuted condition, through the executor (reconcile/execute.py). False:
        the scaler is gone."""
        return self.report(ScriptCondition(kind_name, ns, status, reason, message))
