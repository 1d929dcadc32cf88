"""The observing half of a pass, without an API server: pods -> views -> probes -> readiness."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from etoperator.api.statuses import JobStatus
from etoperator.cache import Observed
from etoperator.reconcile import state
from etoperator.reconcile.observe import Observer, probes_wanted, running_scale, scaler_view, settle
from etoperator.reconcile.podviews import classify
from etoperator.reconcile.state import Writes
from etoperator.sshcheck import HorovodOn


def pod(name: str, phase: str = "Running", role: str = "worker", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"training-job-role": role}, **meta},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "podIP": "10.0.0.1"},
    }


def test_classify_reads_roles_runs_and_notices() -> None:
    pods = [
        pod("j-worker-3"),
        pod(
            "j-launcher", role="launcher", annotations={"etoperator.kai.alibabacloud.com/run": "2"}
        ),
        pod("j-worker-4", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    w3, launcher, w4 = classify("j", pods, {"n1"})
    assert w3.index == 3 and w3.leaving == "node n1 is tainted for termination"
    assert launcher.index is None and launcher.leaving == ""
    assert w4.deleting and not w4.ready


def test_probes_ask_new_workers_for_readiness_and_drained_victims_for_horovod() -> None:
    views = classify("j", [pod("j-worker-0"), pod("j-worker-1"), pod("j-worker-2")], set())
    scale_in = ("ScaleIn", ["j-worker-1"])
    wanted = probes_wanted(views, {"j-worker-0", "j-worker-1"}, {"j-worker-0"}, scale_in, True)
    assert wanted == {"j-worker-1": "drain", "j-worker-2": "ready"}
    # Without the job's key nothing can be asked about readiness; a victim still in the list
    # is not asked yet (Horovod can still see it).
    published = {"j-worker-0", "j-worker-1"}
    assert probes_wanted(views, {"j-worker-0"}, published, scale_in, False) == {}


def test_probes_ask_a_scale_outs_published_workers_and_one_older_host_about_horovod() -> None:
    views = classify("j", [pod(f"j-worker-{i}") for i in (0, 1, 10, 11)], set())
    scale_out = ("ScaleOut", ["j-worker-10", "j-worker-11"])
    hosts = {"j-worker-0", "j-worker-1"}
    # Not yet published: the new ones are asked whether they are ready.
    assert probes_wanted(views, hosts, hosts, scale_out, True) == {
        "j-worker-10": "ready",
        "j-worker-11": "ready",
    }
    published = hosts | {"j-worker-10", "j-worker-11"}
    assert probes_wanted(views, published, published, scale_out, True) == {
        "j-worker-0": "horovod",
        "j-worker-10": "horovod",
        "j-worker-11": "horovod",
    }
    # Without SSH (no network path to pods) nothing is asked: pods/exec each pass would cost.
    assert probes_wanted(views, published, published, scale_out, False) == {}


def test_settle_gates_new_workers_on_their_answer() -> None:
    new, host = classify("j", [pod("j-worker-2"), pod("j-worker-0")], set())
    assert not settle(new, {}, {"j-worker-0"}, set(), ssh=True).ready
    assert settle(new, {"j-worker-2": True}, {"j-worker-0"}, set(), ssh=True).ready
    assert not settle(new, {"j-worker-2": False}, {"j-worker-0"}, set(), ssh=True).ready
    assert settle(new, {}, {"j-worker-0"}, set(), ssh=False).ready  # no SSH checks: Running
    assert settle(host, {}, {"j-worker-0"}, set(), ssh=True).ready
    idle = HorovodOn(False)
    victim = settle(host, {"j-worker-0": idle}, {"j-worker-0"}, {"j-worker-0"}, ssh=True)
    assert not victim.ready and victim.busy is False
    joined = HorovodOn(True, frozenset({"10.0.0.7"}))
    seen = settle(host, {"j-worker-0": joined}, {"j-worker-0"}, set(), ssh=True)
    assert seen.busy and seen.peers == frozenset({"10.0.0.7"}) and seen.ip == "10.0.0.1"
    assert not seen.horovod_unknown and not settle(host, {}, set(), set(), True).horovod_unknown
    unanswered = settle(host, {"j-worker-0": None}, {"j-worker-0"}, set(), ssh=True)
    assert unanswered.horovod_unknown and unanswered.busy is None  # asked; SSH did not answer


def test_the_running_scale_and_its_pods() -> None:
    scaler = scaler_view(
        {"kind": "ScaleIn", "metadata": {"name": "cut"}, "status": {"toDeletePods": ["a"]}}, None
    )
    grow = scaler_view(
        {"kind": "ScaleOut", "metadata": {"name": "grow"}, "status": {"addPods": ["b"]}}, None
    )
    running = JobStatus(current_scaler="ScaleIn:ns/cut")
    assert running_scale(running, [scaler, grow]) == ("ScaleIn", ["a"])
    assert running_scale(JobStatus(current_scaler="ScaleOut:ns/grow"), [scaler, grow]) == (
        "ScaleOut",
        ["b"],
    )
    assert running_scale(JobStatus(current_scaler="ScaleOut:ns/cut"), [scaler]) == ("", [])


def body(kind: str, name: str, version: str, selects: str = "j") -> dict[str, Any]:
    spec = {"selector": {"name": selects}} if kind != "TrainingJob" else {}
    return {
        "kind": kind,
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": version},
        "spec": spec,
    }


def observed(job: dict[str, Any], *scalers: dict[str, Any]) -> Observed:
    return Observed(job, None, None, [], [], None, list(scalers))


def test_what_a_write_made_stale_is_forgotten_with_the_object() -> None:
    """A scaler deleted before the cache showed our write to it leaves nothing behind."""
    writes = Writes()
    job, scaler = body("TrainingJob", "j", "1"), body("ScaleOut", "out", "5")
    writes.wrote(scaler)
    assert writes.stale(observed(job, scaler))  # the cache still shows the old version
    assert not writes.stale(observed(job, body("ScaleOut", "out", "6")))  # caught up
    writes.wrote(scaler)
    writes.stale(observed(job))  # deleted: the job's view no longer has it
    writes.wrote(job)
    writes.made(job, "Pod", "j-worker-0")
    writes.forget("ns", "j")
    assert writes.count() == 0


def test_the_host_list_is_our_last_write_until_the_cache_moves_past_every_version_it_replaced() -> (
    None
):
    writes = Writes()
    job = body("TrainingJob", "j", "1")
    v1, v2, v3 = (body("ConfigMap", "j-config", v) for v in ("1", "2", "3"))

    def with_cm(cm: dict[str, Any] | None) -> Observed:
        return Observed(job, None, None, [], [], cm, [])

    assert writes.configmap(with_cm(v1)) is v1  # nothing written
    writes.published(job, v1, v2)
    writes.published(job, v2, v3)  # twice before the cache showed the first
    assert writes.configmap(with_cm(v1)) is v3 and writes.configmap(with_cm(v2)) is v3
    v4 = body("ConfigMap", "j-config", "4")  # another's write, after ours
    assert writes.configmap(with_cm(v4)) is v4 and writes.count() == 0
    writes.published(job, v4, body("ConfigMap", "j-config", "5"))
    assert writes.configmap(with_cm(None)) is None and writes.count() == 0  # deleted


def test_a_child_we_created_is_unseen_until_its_cache_shows_it() -> None:
    """Pods and Services: a pass whose caches lag behind the last pass's creates would make
    them again (P5: 1.6 Service creates a job refused as existing, each then read back)."""
    writes = Writes()
    job = body("TrainingJob", "j", "1")
    for kind, name in [("Pod", "j-worker-0"), ("Pod", "j-worker-1"), ("Service", "j-worker-1")]:
        writes.made(job, kind, name)
    seen = Observed(job, None, None, [pod("j-worker-0")], [], None, [])
    assert writes.unseen(seen) == {("Pod", "j-worker-1"), ("Service", "j-worker-1")}
    seen = Observed(job, None, None, [], [{"metadata": {"name": "j-worker-1"}}], None, [])
    assert writes.unseen(seen) == {("Pod", "j-worker-1")}
    assert writes.unseen(observed(job)) == {("Pod", "j-worker-1")}  # shown once: forgotten
    assert writes.unseen(observed(body("TrainingJob", "other", "1"))) == set()


def test_a_pod_deleted_before_its_cache_saw_it_is_made_again_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes = Writes()
    job = body("TrainingJob", "j", "1")
    writes.made(job, "Pod", "j-worker-0")
    later = time.monotonic() + state.MADE_UNSEEN + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    assert writes.unseen(observed(job)) == set() and writes.count() == 0


def test_classify_tells_why_a_pending_pod_cannot_run() -> None:
    unschedulable = pod("j-worker-0", "Pending")
    unschedulable["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."}
    ]  # fmt: skip
    no_image = pod("j-worker-1", "Pending")
    no_image["status"]["containerStatuses"] = [
        {"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}}
    ]
    creating = pod("j-worker-2", "Pending")
    creating["status"]["containerStatuses"] = [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}
    ]
    views = classify("j", [unschedulable, no_image, creating, pod("j-worker-3")], set())
    assert [v.waiting for v in views] == [
        "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.",
        "ErrImageNeverPull: image not present",
        "",
        "",
    ]


def test_scaler_views_follow_each_change_and_forget_what_is_gone() -> None:
    """Views are made again only for scalers that changed (a job scaled often keeps hundreds of
    finished ones); a change, a scaler deleted and a job forgotten are each followed."""
    observer = Observer(kube=None, keys=state.Keys())  # type: ignore[arg-type]
    job = {**body("TrainingJob", "j", "1"), "metadata": {
        "namespace": "ns", "name": "j", "uid": "u1", "resourceVersion": "1"}}  # fmt: skip

    def scaler(name: str, version: str, phase: str) -> dict[str, Any]:
        made = body("ScaleOut", name, version)
        made["metadata"]["uid"] = f"uid-{name}"
        made["spec"]["toAdd"] = {"count": 1}
        return {**made, "status": {"phase": phase}}

    done = [scaler(f"done-{i}", "7", "ScaleSucceeded") for i in range(3)]
    views = observer.scaler_views(observed(job, *done, scaler("out", "8", "")))
    assert [(v.name, v.phase) for v in views][-1] == ("out", "")
    views = observer.scaler_views(observed(job, *done, scaler("out", "9", "Scaling")))
    assert [v.phase for v in views] == ["ScaleSucceeded"] * 3 + ["Scaling"]
    assert [v.name for v in observer.scaler_views(observed(job, done[0]))] == ["done-0"]
    unversioned = scaler("out", "9", "ScaleSucceeded")
    del unversioned["metadata"]["resourceVersion"]  # no version to go by: parsed every time
    assert observer.scaler_views(observed(job, unversioned))[0].phase == "ScaleSucceeded"
    observer.forget(state.job_prefix("ns", "j"))
    assert observer.scaler_views(observed(job)) == []
    assert observer.held_views() == 0


def test_a_pod_no_scheduler_takes_up_is_said_to_wait_for_one() -> None:
    """A schedulerName naming no scheduler: the pod stays Pending with no PodScheduled
    condition, and the job said nothing (121 s seen)."""
    made = datetime(2026, 1, 1, 12, 0, 0)
    pod = {
        "metadata": {"name": "j-worker-0", "creationTimestamp": "2026-01-01T12:00:00Z",
                     "labels": {"training-job-role": "worker"}},
        "spec": {"schedulerName": "no-such"},
        "status": {"phase": "Pending"},
    }  # fmt: skip
    (soon,) = classify("j", [pod], set(), made + timedelta(seconds=5))
    assert soon.waiting == ""
    (late,) = classify("j", [pod], set(), made + timedelta(seconds=30))
    assert "no scheduler has taken it up in 30s (schedulerName no-such)" in late.waiting


class LauncherLog:
    """A launcher whose log the test writes to; `pod_log` reads it as the API would."""

    def __init__(self) -> None:
        self.text = ""

    def pod_log(self, ns: str, name: str, tail: int) -> str:
        return self.text


def test_what_the_launcher_said_is_read_fresh_as_a_waiting_scale_out_times_out() -> None:
    """The launcher's log is read at most every LOG_EVERY seconds while a ScaleOut waits on
    Horovod; near its timeout it is read at every pass, so the rollback's message has the
    launcher's last words (a line said in the last seconds was missed)."""
    start = datetime(2026, 1, 1, 12, 0, 0)
    mono, wall = [100.0], [start]
    launcher = LauncherLog()
    observer = Observer(kube=launcher, keys=state.Keys(),  # type: ignore[arg-type]
                        now=lambda: mono[0], wall=lambda: wall[0])  # fmt: skip
    job = {"metadata": {"namespace": "ns", "name": "j", "uid": "u1"},
           "status": {"currentScaler": "ScaleOut:ns/grow"}}  # fmt: skip
    waiting = {"type": "Scaling", "status": "True", "reason": "WaitingForHorovod"}
    grow = scaler_view({
        "kind": "ScaleOut", "metadata": {"namespace": "ns", "name": "grow"},
        "spec": {"selector": {"name": "j"}, "toAdd": {"count": 1}, "timeout": 30},
        "status": {"addPods": ["j-worker-2"], "startTime": "2026-01-01T12:00:00Z",
                   "conditions": [waiting]},
    }, None)  # fmt: skip
    obs = observed(job)

    def said(after: float) -> tuple[str, ...]:
        mono[0] += 1.0
        wall[0] = start + timedelta(seconds=after)
        return observer.launcher_said(obs, [grow])

    assert said(10) == ()
    launcher.text = "ssh: Could not resolve hostname j-worker-2: Name or service not known"
    assert said(11) == ()  # read a second ago: not again yet
    assert said(29) == (launcher.text,)  # its timeout near: read now
    launcher.text += "\nj-worker-2: Connection timed out"
    assert said(30)[-1] == "j-worker-2: Connection timed out"
