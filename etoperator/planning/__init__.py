"""Pure planning: observed world + job status -> what to create, delete and write.

One function, `plan_job`, decides everything for a job and its scalers. It never talks to the
API server, reads no clock and draws no random numbers: the reconciler observes, calls it,
acts on the plan, and writes the status it returns. Planning twice from the same observation
gives the same plan, which is what makes restarts and retries safe.

The job's status carries the few facts that cannot be observed again:
  targetWorkers   the membership: pods this run should have (created or still to create)
  currentWorkers  the host list Horovod sees
  lastWorkerIndex the highest index ever used, so names are never reused
  runStartIndex   first index of the current run; lower ones belong to an earlier run
  acceptedReplicas spec.etReplicaSpecs.worker.replicas as last acted upon (`kubectl scale`)
  currentScaler   the one scaler allowed to touch pods, whose plan is frozen in its status
  scalerPods      that plan again, so a scaler deleted while it runs can be undone
"""

from __future__ import annotations

from etoperator.planning.lifecycle import plan_job
from etoperator.planning.orphans import plan_orphan_scaler
from etoperator.planning.plan import Plan
from etoperator.planning.rules import (
    check_scale_in,
    check_scale_out,
    replaces,
    scaler_order,
    script_argv,
    victims_by_count,
)
from etoperator.planning.views import BasicsView, JobInput, PodView, ScalerView

__all__ = [
    "BasicsView", "JobInput", "Plan", "PodView", "ScalerView", "check_scale_in", "check_scale_out",
    "plan_job", "plan_orphan_scaler", "replaces", "scaler_order", "script_argv",
    "victims_by_count",
]  # fmt: skip
