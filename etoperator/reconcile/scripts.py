"""Scaler scripts: run on the launcher off the reconcile path, the outcome on the scaler."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from etoperator import naming
from etoperator import status as st
from etoperator.api.statuses import scaler_status
from etoperator.cache import Observed
from etoperator.clock import iso, utcnow
from etoperator.kube import Conflict, Kube
from etoperator.planning import Plan
from etoperator.planning.scaling import SCRIPT_EXECUTED, SCRIPT_GRACE
from etoperator.reconcile.state import Writes, job_id

log = logging.getLogger(__name__)


@dataclass
class Scripts:
    """Scaler scripts in flight (a thread each) and those already reported."""

    kube: Kube
    writes: Writes
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
        for kind_name, argv, timeout in plan.run_scripts:
            run = f"{jid}/{kind_name[0]}/{kind_name[1]}"
            with self._lock:
                if run in self._running or run in self._done:
                    continue  # still running from an earlier pass, or ran already
                thread = threading.Thread(
                    target=self.run_script,
                    args=(meta["namespace"], meta["name"], kind_name, argv, timeout, run),
                    name=f"etoperator-script-{kind_name[1]}",
                    daemon=True,
                )
                self._running[run] = thread
            thread.start()

    def run_script(
        self, ns: str, job: str, kind_name: tuple[str, str], argv: list[str], timeout: int, run: str
    ) -> None:
        """Marked as started on the scaler first (an operator that restarts meanwhile does not
        start a second copy while this one may run), then run; the outcome becomes the
        scaler's ScriptExecuted condition, and writing it wakes the job."""
        launcher = naming.launcher_name(job)
        try:
            if not self.mark_script(
                kind_name, ns, "Unknown", "ScriptRunning", f"started on {launcher}"
            ):
                return  # the scaler is gone
            code, output = self.kube.exec_in_pod(ns, launcher, argv, timeout + SCRIPT_GRACE)
            log.info(
                "Scaler script ran namespace=%s scaler=%s exit_code=%s", ns, kind_name[1], code
            )
            log.debug(
                "Scaler script output namespace=%s scaler=%s output=%r",
                ns,
                kind_name[1],
                output[-2000:],
            )
            ok = code == 0
            reason = "ScriptSucceeded" if ok else "ScriptFailed"
            message = f"script exited {code} on {launcher}"
            if self.mark_script(kind_name, ns, "True" if ok else "False", reason, message):
                with self._lock:
                    self._done.add(run)
        except Exception:  # a refused write: the next pass asks again (once its timeout passed)
            log.exception("Scaler script not reported namespace=%s scaler=%s", ns, kind_name[1])
        finally:
            with self._lock:
                self._running.pop(run, None)

    def mark_script(
        self, kind_name: tuple[str, str], ns: str, status: str, reason: str, message: str
    ) -> bool:
        """The ScriptExecuted condition, written on the version read (a pass writing the scaler
        in between makes it read again) and remembered as our write, so that a pass whose cache
        has not seen it yet waits instead of acting on the old one. An outcome (True/False) is
        also an Event. False: the scaler is gone."""
        kind, name = kind_name
        for _ in range(5):
            scaler = self.kube.get(kind, ns, name)
            if scaler is None:
                return False
            conds, _ = st.set_condition(
                scaler_status(kind, scaler.get("status")).conditions or [],
                SCRIPT_EXECUTED, status, reason, message, iso(self.clock()),
            )  # fmt: skip
            version = {"resourceVersion": scaler["metadata"]["resourceVersion"]}
            try:
                self.kube.patch(
                    kind, ns, name, {"status": {"conditions": conds}, "metadata": version},
                    sub="status",
                )  # fmt: skip
            except Conflict:
                continue
            self.writes.wrote(scaler)
            if status != "Unknown":
                etype = "Normal" if status == "True" else "Warning"
                self.kube.event(scaler, etype, reason, message, self.clock())
            return True
        raise RuntimeError(f"{kind} {ns}/{name} kept changing while its script was reported")
