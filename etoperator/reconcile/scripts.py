"""Scaler scripts: run on the launcher off the reconcile path, the outcome on the scaler."""

from __future__ import annotations

import logging

from etoperator import naming
from etoperator import status as st
from etoperator.cache import Observed
from etoperator.kube import Conflict
from etoperator.planning import Plan
from etoperator.reconcile.state import State, job_key

log = logging.getLogger(__name__)


class Scripts(State):
    def run_scripts(self, obs: Observed, plan: Plan) -> None:
        """Scaler scripts, on the launcher, off the reconcile path: the job keeps being looked
        after while one runs, and its scaler waits for the ScriptExecuted condition."""
        meta = obs.job["metadata"]
        for key, argv, timeout in plan.run_scripts:
            run = f"{job_key(meta['namespace'], meta['name'], meta['uid'])}/{key[0]}/{key[1]}"
            with self._lock:
                if run in self._scripts or run in self._scripts_done:
                    continue  # still running from an earlier pass, or ran already
                self._scripts[run] = self.script_pool.submit(
                    self.run_script, meta["namespace"], meta["name"], key, argv, timeout, run
                )

    def run_script(
        self, ns: str, job: str, key: tuple[str, str], argv: list[str], timeout: int, run: str
    ) -> None:
        """The outcome becomes the scaler's ScriptExecuted condition; writing it wakes the job."""
        try:
            code, output = self.kube.exec_in_pod(ns, naming.launcher_name(job), argv, timeout + 5)
            log.info("Scaler script ran namespace=%s scaler=%s exit_code=%s", ns, key[1], code)
            log.debug(
                "Scaler script output namespace=%s scaler=%s output=%r", ns, key[1], output[-2000:]
            )
            self.report_script(key, ns, code, naming.launcher_name(job))
            with self._lock:
                self._scripts_done.add(run)
        except Exception:  # a refused write: the next pass asks again
            log.exception("Scaler script not reported namespace=%s scaler=%s", ns, key[1])
        finally:
            with self._lock:
                self._scripts.pop(run, None)

    def report_script(self, key: tuple[str, str], ns: str, code: int | None, launcher: str) -> None:
        """The ScriptExecuted condition, written on the version read (a pass writing the scaler
        in between makes it read again) and remembered as our write, so that a pass whose cache
        has not seen it yet waits instead of asking for the script again."""
        ok = code == 0
        msg = f"script exited {code} on {launcher}"
        reason = "ScriptSucceeded" if ok else "ScriptFailed"
        for _ in range(5):
            scaler = self.kube.get(key[0], ns, key[1])
            if scaler is None:
                return  # deleted meanwhile: nobody to tell
            meta = scaler["metadata"]
            conds, _ = st.set_condition(
                (scaler.get("status") or {}).get("conditions") or [],
                "ScriptExecuted", "True" if ok else "False", reason, msg, self.now(),
            )  # fmt: skip
            change = {
                "status": {"conditions": conds},
                "metadata": {"resourceVersion": meta["resourceVersion"]},
            }
            try:
                self.kube.patch(key[0], ns, key[1], change, sub="status")
            except Conflict:
                continue
            self.wrote(scaler)
            self.kube.event(scaler, "Normal" if ok else "Warning", reason, msg, self.clock())
            return
        raise RuntimeError(f"{key[0]} {ns}/{key[1]} kept changing while its script was reported")
