"""Gang jobs (spec.schedulingPolicy): whether the Workload API is served, and the scheduler's
word on the workers' PodGroup, as the planner sees them; the Workload and PodGroup made before
the first worker. The planner's side is planning/gangs.py."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from etoperator import naming
from etoperator import status as st
from etoperator.api.models import JobSpec
from etoperator.builders import gang
from etoperator.builders.common import is_controlled_by, job_owner
from etoperator.cache import Observed
from etoperator.kube import AlreadyExists, Kube
from etoperator.planning.views import GangView
from etoperator.reconcile.state import Served

SERVED_TTL = (300.0, 30.0)  # how long "the Workload API is served" is believed: (yes, no)


@dataclass
class Gangs:
    kube: Kube

    def __post_init__(self) -> None:
        self.served = Served(self.kube, gang.API, SERVED_TTL)

    def view(self, obs: Observed, spec: JobSpec) -> GangView | None:
        if spec.gang is None:
            return None
        if obs.pod_group is None and not self.served():
            return GangView(served=False)
        # Ours carry our labels (the watch's); one of that name without them is read here,
        # only while ours is not seen (a job's first pass).
        name = naming.pod_group_name(spec.name)
        group = obs.pod_group or self.kube.get(naming.POD_GROUP_KIND, spec.namespace, name)
        if group is not None and not is_controlled_by(group, spec.uid):
            return GangView(
                group=True,
                conflict=f"PodGroup {name} exists and is not this job's: its workers would "
                "join another gang; no worker is made until it is gone",
            )
        workers = [
            p for p in obs.pods
            if (p["metadata"].get("labels") or {}).get(naming.LABEL_ROLE) == naming.ROLE_WORKER
            and not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        if group is None and workers:
            return GangView(deferred=True)  # the policy came while its workers run
        gang_policy = (((group or {}).get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
        min_count = (gang_policy or {}).get("minCount")
        conds = ((obs.pod_group or {}).get("status") or {}).get("conditions") or []
        said = st.condition(conds, "PodGroupScheduled") or {}
        why = str(said.get("message") or "") if said.get("status") == "False" else ""
        return GangView(
            group=obs.pod_group is not None,
            why=why,
            min_count=int(min_count) if isinstance(min_count, int) else None,
        )

    def make(self, spec: JobSpec) -> None:
        """The Workload, then the PodGroup made from its template (either may be there)."""
        owner = job_owner(spec)
        for body in (gang.workload(spec, owner), gang.pod_group(spec, owner)):
            with contextlib.suppress(AlreadyExists):
                self.kube.create(body)
