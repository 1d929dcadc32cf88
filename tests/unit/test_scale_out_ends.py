"""How a ScaleOut that Horovod does not take in ends: never a success while the run is
ending, and in the words the launcher printed of its workers."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from etoperator.planning import plan_job
from etoperator.reconcile.launcherlog import words_about
from localcluster.manifests import scaleout
from tests.unit.test_planning import NOW, inp, jspec, launcher, running_status, scaler, w
from tests.unit.test_planning import horovod as hvd

HOSTS = ["j-worker-0", "j-worker-1", "j-worker-2"]
STARTED = "2026-01-01T11:59:50Z"


def waiting_for_horovod() -> dict[str, object]:
    """A ScaleOut's status once it has waited for Horovod (which ran on the earlier hosts)."""
    spec = jspec(maxReplicas=4)
    frozen = {"phase": "Scaling", "addPods": ["j-worker-2"], "startTime": STARTED}
    so = scaler(scaleout("grow", "j", 1), status=frozen)
    status = running_status([0, 1, 2], hosts=[0, 1, 2], currentScaler="ScaleOut:ns/grow")
    pods = [hvd(0, 1), hvd(1, 0), w(2, ip="10.0.0.2", busy=False), launcher()]
    plan = plan_job(inp(spec, status, pods, [so], published=HOSTS))
    return plan.scaler_status[so.kind_name].to_dict()


def test_a_scale_out_never_succeeds_once_horovod_has_left_the_earlier_hosts() -> None:
    """Horovod's ranks gave up their rendezvous (the new worker's ssh had failed): no Horovod
    process left on the earlier hosts was read as "Horovod does not run in this job", and the
    ScaleOut succeeded a second before the job failed."""
    spec = jspec(maxReplicas=4)
    seen = waiting_for_horovod()
    so = scaler(scaleout("grow", "j", 1), status=seen)
    status = running_status([0, 1, 2], hosts=[0, 1, 2], currentScaler="ScaleOut:ns/grow")
    gone = [w(0, ip="10.0.0.0", busy=False), w(1, ip="10.0.0.1", busy=False),
            w(2, ip="10.0.0.2", busy=False), launcher()]  # fmt: skip
    plan = plan_job(inp(spec, status, gone, [so], published=HOSTS))
    assert plan.scaler_status.get(so.kind_name, so.status).phase == "Scaling"
    assert plan.status.current_scaler == "ScaleOut:ns/grow"
    late = plan_job(inp(spec, status, gone, [so], published=HOSTS, now=NOW + timedelta(seconds=60)))
    ended = late.scaler_status[so.kind_name].to_dict()
    assert ended["phase"] == "ScaleFailed", ended
    assert "no longer runs on the earlier hosts" in str(ended["conditions"])


def test_a_rolled_back_scale_out_says_what_the_launcher_said() -> None:
    spec = jspec(maxReplicas=4)
    so = scaler(scaleout("grow", "j", 1), status=waiting_for_horovod())
    status = running_status([0, 1, 2], hosts=[0, 1, 2], currentScaler="ScaleOut:ns/grow")
    pods = [hvd(0, 1), hvd(1, 0), w(2, ip="10.0.0.2", busy=False), launcher()]
    said = ("ssh: Could not resolve hostname j-worker-2: Name or service not known",)
    base = inp(spec, status, pods, [so], published=HOSTS, now=NOW + timedelta(seconds=60))
    plan = plan_job(dataclasses.replace(base, launcher_said=said))
    ended = plan.scaler_status[so.kind_name].to_dict()
    assert ended["phase"] == "ScaleFailed"
    assert said[0] in str(ended["conditions"]) and "--max-np" not in str(ended["conditions"])


def test_the_launcher_s_lines_about_a_worker_are_matched_as_a_whole_name() -> None:
    log = "\n".join([
        "[0]<stdout>: step 5 size 2",
        "ssh: connect to host j-worker-10 port 22: Connection refused",
        "ssh: Could not resolve hostname j-worker-1: Name or service not known",
        "ssh: Could not resolve hostname j-worker-1: Name or service not known",
    ])  # fmt: skip
    assert words_about(log, ["j-worker-1"]) == [
        "ssh: Could not resolve hostname j-worker-1: Name or service not known"
    ]
    assert words_about(log, ["j-worker-3"]) == []
