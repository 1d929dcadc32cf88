"""Scaling: the scaler queue, ScaleOut, ScaleIn, and spec replicas (`kubectl scale`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from etoperator import naming
from etoperator import status as st
from etoperator.clock import parse_iso
from etoperator.planning.base import Base, Members
from etoperator.planning.jobstatus import ScalerStatus
from etoperator.planning.rules import check_scale_in, check_scale_out, scaler_order, script_argv
from etoperator.planning.views import ScalerView

SCRIPT_EXECUTED = "ScriptExecuted"
# Beyond its timeout, how long a script's exec may take to end (the `timeout` it runs under
# kills it at its timeout; the exec stream is given this much more).
SCRIPT_GRACE = 5


class Scaling(Base):
    def timed_out(self, sc: ScalerView) -> bool:
        assert sc.spec is not None
        started = parse_iso(ScalerStatus.from_dict(sc.status).start_time)
        return started is not None and self.inp.now - started >= timedelta(seconds=sc.spec.timeout)

    def drive_scale_out(self, sc: ScalerView, m: Members, broken: list[str]) -> Members:
        """New workers join the host list together, once all are ready; the scaler succeeds
        once Horovod can see them."""
        new = sc.planned
        taken = [n for n in new if n in self.inp.squatted]
        if taken:  # never ours to wait for, nor to remove
            ours = [n for n in new if n not in taken]
            removed = f"; removed {', '.join(ours)}" if ours else ""
            why = f"pod {', '.join(taken)} exists and is not this job's"
            return self.scale_out_failed(sc, m, ours, why, f"{why}; nothing added{removed}")
        missing = [n for n in new if not (self.workers.get(n) and self.workers[n].ready)]
        # The timeout bounds the joining only: once they are in, a script that runs on is
        # reported when it ends (bounded by the same timeout), never a rollback.
        if broken or (missing and self.timed_out(sc)):
            assert sc.spec is not None
            why = (
                f"new workers failed while joining: {', '.join(broken)}"
                if broken
                else f"new workers not ready within {sc.spec.timeout}s: "
                + ", ".join(self.not_ready_why(n) for n in missing)
            )
            return self.scale_out_failed(sc, m, new, why, f"{why}; removed {', '.join(new)}")
        if missing:
            assert sc.spec is not None
            what = (
                f"waiting for {', '.join(self.not_ready_why(n) for n in missing)} to accept the "
                f"job's SSH key (up to the {sc.spec.timeout}s timeout)"
            )
            self.wait_on(sc, "WaitingForWorkers", what, f"new workers not ready: {missing}")
            return m
        m = m.hosting(*new)
        # Succeed only once Horovod can see them: the ConfigMap is written after statuses.
        if not set(new) <= set(self.inp.published or []):
            self.again("new workers not yet in the published host list")
        elif self.script_done(sc, new):
            self.finish_scale(sc, f"added {', '.join(new)} to the host list")
        return m

    def wait_on(self, sc: ScalerView, reason: str, what: str, why: str) -> None:
        """A running scale that waits says for what on its Scaling condition (and comes back)."""
        self.scaler_cond(sc, st.SCALE_RUNNING, st.SCALE_RUNNING, reason, what)
        self.again(why)

    def not_ready_why(self, name: str) -> str:
        """A worker that is not ready, and what holds it if its pod says (unschedulable, an
        image that cannot be had)."""
        pod = self.workers.get(name)
        return f"{name} ({pod.waiting})" if pod is not None and pod.waiting else name

    def scale_out_failed(
        self, sc: ScalerView, m: Members, ours: list[str], why: str, message: str
    ) -> Members:
        for n in ours:
            self.delete(n)
        self.fail_scaler(sc, "ScaleOutFailed", message)
        self.s.current_scaler = ""
        self.cond(st.SCALING, "False", "ScaleOutFailed", why)
        return m.without(*sc.planned)

    def drive_scale_in(self, sc: ScalerView, m: Members) -> Members:
        """Victims leave the host list first, then their pods go once Horovod has left them
        (or the scaler's timeout runs out)."""
        victims = sc.planned
        m = m.without(*victims)
        published = set(self.inp.published or [])
        alive = [v for v in victims if v in self.workers and not self.workers[v].deleting]
        # A victim has drained when Horovod no longer runs on it (or its pod is not running).
        draining = [
            v
            for v in alive
            if self.workers[v].phase == "Running"
            and (v in published or self.workers[v].busy is not False)
        ]
        if not set(victims) & published and not self.script_done(sc, victims):
            return m
        if draining and not self.timed_out(sc):
            assert sc.spec is not None
            what = (
                f"waiting for Horovod to stop on {', '.join(draining)} (up to the "
                f"{sc.spec.timeout}s timeout, then they are deleted anyway)"
            )
            self.wait_on(sc, "Draining", what, f"victims still draining: {draining}")
            return m
        for v in alive:
            self.delete(v)
        if draining:
            assert sc.spec is not None
            self.scaler_cond(
                sc,
                st.SCALE_RUNNING,
                "DrainTimeout",
                "DrainTimeout",
                f"Horovod still ran on {', '.join(draining)} after {sc.spec.timeout}s; "
                "deleted anyway",
                warn=True,
            )
        self.finish_scale(sc, f"removed {', '.join(victims)}")
        return m

    def script_done(self, sc: ScalerView, pods: list[str]) -> bool:
        """The scaler's script (if any) has run on the launcher; else ask for it to run. One
        marked as started (by an operator that may since have restarted) may still run: it is
        asked for again only once its timeout, which ends it in the launcher, has passed."""
        assert sc.spec is not None
        ran = st.condition(sc.status.get("conditions") or [], SCRIPT_EXECUTED)
        if not sc.spec.script or (ran and ran.get("status") in ("True", "False")):
            return True
        if self.launcher is None or self.launcher.phase != "Running":
            return True  # nowhere to run it; the scale itself goes on
        started = parse_iso(str((ran or {}).get("lastTransitionTime") or "")) if ran else None
        if started is not None and self.inp.now < started + timedelta(
            seconds=sc.spec.timeout + SCRIPT_GRACE
        ):
            self.again("the scaler's script runs")
            return False
        argv = script_argv(sc.spec, pods, self.job().slots_per_worker)
        self.plan.run_scripts.append((sc.key, argv, sc.spec.timeout))
        self.again("the scaler's script runs")
        return False

    def finish_scale(self, sc: ScalerView, what: str) -> None:
        self.scaler_cond(sc, st.SCALE_SUCCEEDED, st.SCALE_SUCCEEDED, "ScaleSucceeded", what)
        self.s.current_scaler = ""
        self.cond(st.SCALING, "False", "ScaleSucceeded", f"{sc.kind} {sc.name}: {what}")

    def start_scalers(self) -> None:
        """Fail bad scalers; start the oldest waiting one when none runs."""
        job = self.job()
        waiting = []
        for sc in sorted(self.inp.scalers, key=scaler_order):
            if sc.phase in st.SCALE_TERMINAL or sc.key in self.plan.scaler_status:
                continue
            if sc.spec is None:
                self.fail_scaler(sc, "InvalidSpec", sc.error or "invalid spec")
            else:
                waiting.append(sc)
        if self.s.current_scaler or not waiting:
            return
        members, hosts = self.s.members, self.s.hosts
        for sc in waiting:
            spec = sc.spec
            assert spec is not None
            if spec.kind == naming.SCALEOUT_KIND:
                problem = check_scale_out(job, members, spec)
                if problem:
                    self.fail_scaler(sc, "MaxReplicasExceeded", problem)
                    continue
                assert spec.count is not None
                first = self.last_index() + 1
                planned = [
                    naming.worker_name(job.name, i) for i in range(first, first + spec.count)
                ]
                self.s.last_worker_index = first + spec.count - 1
                self.s.target_workers = members + planned
                self.plan.create_workers.extend(range(first, first + spec.count))
                what = f"adding {', '.join(planned)}"
            else:
                planned, problem = check_scale_in(job, members, hosts, spec)
                if problem:
                    self.fail_scaler(sc, "InvalidScaleIn", problem)
                    continue
                self.s.target_workers = [m for m in members if m not in planned]
                self.s.current_workers = [h for h in hosts if h not in planned]
                self.plan.hosts = self.s.current_workers
                what = f"removing {', '.join(planned)}"
            new = ScalerStatus.from_dict(sc.status)
            if spec.kind == naming.SCALEOUT_KIND:
                new.add_pods = planned
            else:
                new.to_delete_pods = planned
            new.start_time = self.now
            self.plan.scaler_status[sc.key] = new.to_dict()
            self.scaler_cond(sc, st.SCALE_RUNNING, st.SCALE_RUNNING, "Scaling", what)
            self.s.current_scaler = naming.scaler_ref(sc.kind, self.inp.namespace, sc.name)
            self.s.scaler_pods = planned
            self.cond(st.SCALING, "True", "Scaling", f"{sc.kind} {sc.name}: {what}")
            self.again("a scaler started")
            return

    def replicas(self) -> None:
        """spec replicas follow the membership each scaler sets (so `kubectl get tj` shows the
        target, and a failed scale gives back the real size); a change by anyone else is a
        request, run as a scaler of the difference once the queue is empty."""
        request = self.replicas_request()
        if request is not None:
            self.take_request(request)
        elif (self.inp.status.get("currentScaler") or "") != (self.s.current_scaler or ""):
            self.follow(len(self.s.members))

    def replicas_request(self) -> int | None:
        """The spec replicas a user asked for and the operator has not taken up, if any.

        acceptedReplicas is the value accounted for. While the operator's own write of it may
        not have landed, replicasBefore holds the value it replaces: seeing that value is our
        write still to do (done again here), never a request, whatever crash came between."""
        spec = self.job().worker.replicas
        accepted = self.s.accepted_replicas
        if accepted is None or spec == accepted:
            self.accept(spec)
            return None
        if spec == self.s.replicas_before:
            self.plan.spec_replicas = int(accepted)
            return None
        if any(sc.made_for == self.inp.generation and sc.owned for sc in self.inp.scalers):
            self.accept(spec)  # its scaler exists: the request is queued like any other
            return None
        return spec

    def take_request(self, replicas: int) -> None:
        job = self.job()
        if self.s.current_scaler or any(
            sc.phase not in st.SCALE_TERMINAL and sc.key not in self.plan.scaler_status
            for sc in self.inp.scalers
        ):
            return  # let queued scalers run first; the difference is taken afterwards
        delta = replicas - len(self.s.members)
        if delta == 0:
            self.accept(replicas)
            return
        kind = naming.SCALEOUT_KIND if delta > 0 else naming.SCALEIN_KIND
        body: dict[str, Any] = {"selector": {"name": job.name}}
        if delta > 0:
            body["toAdd"] = {"count": delta}
        else:
            body["toDelete"] = {"count": -delta}
        # Accepted once seen: a crash before the create lands leaves the request standing.
        self.plan.create_scalers.append(
            {
                "kind": kind,
                "name": naming.replicas_scaler_name(job.name, self.inp.generation),
                "generation": self.inp.generation,
                "spec": body,
            }
        )
        self.again("a scaler for kubectl scale is being made")
