"""Round four of bad input that harmed or went unanswered: each gets a clear answer, loses
nothing, and cannot be got past by ordering (an object made later, or made first)."""

from __future__ import annotations

import time

import pytest
import yaml

from etoperator import naming
from localcluster.cluster import OPERATOR_NS, OPERATOR_SA
from localcluster.manifests import job, scaleout
from localcluster.queues import KUEUE, core_workloads, live_workloads, make_queue, queued_job
from tests.harness import Cluster, wait_for
from tests.support.waits import running

pytestmark = pytest.mark.integration


def uids(cluster: Cluster, ns: str, job_name: str) -> dict[str, str]:
    return {p: cluster.obj("Pod", ns, p)["metadata"]["uid"] for p in cluster.pods(ns, job_name)}


def test_a_secret_named_before_its_job_exists_never_holds_that_job_s_key(
    cluster: Cluster, ns: str
) -> None:
    """Job a's worker mounts Secret b (optional: it need not exist). The template check asks
    only of Secrets that exist, and a job's SSH Secret is named after the job: TrainingJob b,
    made later, had its private key mounted into a's running worker. Now b's Secret is not
    made while another job names it: b says why, a runs on untouched, and b starts once a
    no longer names it."""
    a = job("a", replicas=1)
    pod = a["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
    pod["volumes"].append({"name": "stolen", "secret": {"secretName": "b", "optional": True}})
    pod["containers"][0]["volumeMounts"].append({"name": "stolen", "mountPath": "/stolen"})
    cluster.create(a, ns)
    running(cluster, ns, "a", 1)
    before = uids(cluster, ns, "a")
    cluster.create(job("b", replicas=1), ns)

    def blocked() -> bool:
        cond = cluster.condition(ns, "b", "Blocked") or {}
        return cond.get("status") == "True" and "TrainingJob a names Secret b" in str(
            cond.get("message")
        )

    wait_for(blocked, 20, "b blocked, naming a")
    cluster.wait_event(ns, "b", "ChildConflict", "Warning")
    assert cluster.api.get("Secret", ns, "b") is None
    assert cluster.pods(ns, "b", live=False) == []
    # (An optional volume of no Secret is an empty directory: only the kubelet's dot entries.)
    stolen = cluster.exec(ns, "a-worker-0", "ls", "/stolen").stdout.split()
    assert stolen == [], f"b's key reached a's worker: {stolen}"
    assert uids(cluster, ns, "a") == before and cluster.phase(ns, "a") == "Running"
    cluster.kubectl("delete", "tj", "a", "-n", ns)
    running(cluster, ns, "b", 1)


def test_a_pod_never_runs_as_the_operator_s_own_account(cluster: Cluster, ns: str) -> None:
    """Where jobs may be made in the operator's own namespace, a launcher template naming the
    operator's ServiceAccount ran with its token (which lists every Secret of the cluster)."""
    body = job("borrow", replicas=1)
    body["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["serviceAccountName"] = (
        OPERATOR_SA
    )
    cluster.create(body, OPERATOR_NS)
    try:
        wait_for(lambda: cluster.phase(OPERATOR_NS, "borrow") == "Failed", 20, "refused")
        failed = cluster.condition(OPERATOR_NS, "borrow", "Failed") or {}
        assert failed.get("reason") == "InvalidSpec", failed
        assert "launcher.template.spec.serviceAccountName" in str(failed.get("message"))
        assert cluster.pods(OPERATOR_NS, "borrow", live=False) == []
        # Elsewhere an account of that name is the user's own: taken as it is.
        cluster.kubectl("create", "serviceaccount", OPERATOR_SA, "-n", ns)
        cluster.create(body, ns)
        running(cluster, ns, "borrow", 1)
    finally:
        cluster.kubectl("delete", "tj", "borrow", "-n", OPERATOR_NS, "--wait=false")


def test_a_forged_slice_never_fails_a_running_job(cluster: Cluster, ns: str) -> None:
    """A Workload copied from the job's (its labels, controller reference, and the slice
    annotation naming the job's Workload) with a larger count: Kueue admitted it and finished
    the job's Workload, the operator deleted it as a stray, then read its own Workload as ended:
    Failed/WorkloadFinished, every pod deleted. (The operator is stopped meanwhile, so that
    Kueue's admission comes before the stray's deletion, as it did.) Only slices the operator
    made are slices: the job lost its admission, it did not end; it queues again and runs."""
    make_queue(cluster, ns, pods=6)
    cluster.create(queued_job("mark", maxReplicas=4), ns)
    wait_for(lambda: len(cluster.hosts(ns, "mark")) == 2, 60, "mark running")
    (real,) = core_workloads(cluster, ns, "mark")
    spec = {k: v for k, v in real["spec"].items() if k != "active"}
    spec["podSets"] = [
        {**ps, "count": 3 if ps["name"] == "worker" else ps["count"]}
        for ps in real["spec"]["podSets"]
    ]
    name = real["metadata"]["name"]
    forged = {
        "apiVersion": KUEUE,
        "kind": "Workload",
        "metadata": {
            "name": f"{name}-forged",
            "namespace": ns,
            "labels": real["metadata"]["labels"],
            "ownerReferences": real["metadata"]["ownerReferences"],
            "annotations": {
                **(real["metadata"].get("annotations") or {}),
                "kueue.x-k8s.io/workload-slice-replacement-for": f"{ns}/{name}",
            },
        },
        "spec": spec,
    }
    cluster.operator.kill()
    try:
        cluster.api.create(forged)
        wait_for(lambda: forged_body(cluster, ns, name),
                 30, "Kueue finishing the job's Workload for the forged one")  # fmt: skip
        cluster.api.delete(naming.WORKLOAD_KIND, ns, f"{name}-forged")
    finally:
        cluster.operator.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # sampled: the job never fails
        assert cluster.phase(ns, "mark") != "Failed", cluster.describe(ns, "mark")
        time.sleep(0.2)  # the sampling period
    wait_for(lambda: len(cluster.hosts(ns, "mark")) == 2 and cluster.phase(ns, "mark")
             == "Running", 90, "mark running at 2 again")  # fmt: skip
    assert len(core_workloads(cluster, ns, "mark")) == 1


def forged_body(cluster: Cluster, ns: str, name: str) -> dict[str, object] | None:
    """The forged Workload once it is the job's only live core (Kueue finished the real one)."""
    live = core_workloads(cluster, ns, "mark")
    return live[0] if [w["metadata"]["name"] for w in live] == [f"{name}-forged"] else None


def test_a_scaler_of_a_queued_job_is_answered_and_its_timeout_runs(
    cluster: Cluster, ns: str
) -> None:
    """Scalers of a job that does not run got no status, and their timeout never ran (222 s
    with `timeout: 20`): they ran later, or never."""
    make_queue(cluster, ns, pods=1)  # room for nothing of it
    cluster.create(queued_job("stuck"), ns)
    wait_for(lambda: cluster.phase(ns, "stuck") == "Queued", 20, "queued")
    scaler_waits_then_fails(cluster, ns, "stuck", "quota")
    failed = cluster.condition(ns, "more", "ScaleFailed", "ScaleOut") or {}
    assert "did not run within the 8s timeout" in str(failed.get("message")), failed
    assert cluster.pods(ns, "stuck", live=False) == []


def test_a_scale_out_whose_slice_cannot_be_made_says_why(cluster: Cluster, ns: str) -> None:
    """The job's priority-class label names a WorkloadPriorityClass that is gone: its slice
    cannot be made, and the ScaleOut said only "queued"."""
    make_queue(cluster, ns, pods=6)
    wpc = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
           "metadata": {"name": f"gone-{ns}"}, "value": 10}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(wpc))
    body = queued_job("prio", maxReplicas=3)
    body["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"gone-{ns}"
    cluster.create(body, ns)
    wait_for(lambda: len(cluster.hosts(ns, "prio")) == 2, 60, "running")
    cluster.kubectl("delete", "workloadpriorityclass", f"gone-{ns}")
    cluster.create(scaleout("more", "prio", 1, timeout=8), ns)
    wait_for(lambda: cluster.phase(ns, "more", "ScaleOut") == "ScaleFailed", 30, "failed")
    failed = str((cluster.condition(ns, "more", "ScaleFailed", "ScaleOut") or {}).get("message"))
    assert f"WorkloadPriorityClass gone-{ns}" in failed and "does not exist" in failed, failed
    assert len(cluster.hosts(ns, "prio")) == 2  # the worker never admitted was never listed
    # the job says Scaling until its rollback is done (the new worker's Service gone): a pass on
    wait_for(lambda: cluster.phase(ns, "prio") == "Running", 20, "the job Running again")
    assert len(cluster.hosts(ns, "prio")) == 2


def test_a_queue_label_added_to_a_running_job_loses_nothing(cluster: Cluster, ns: str) -> None:
    """Adding the queue label to a running job restarted the run, every worker replaced.
    Kueue's own integrations refuse a queue change on a running job: here it takes effect at
    the job's next start, and the job says so."""
    make_queue(cluster, ns, pods=6)
    cluster.create(job("late", replicas=2), ns)
    running(cluster, ns, "late", 2)
    before = uids(cluster, ns, "late")
    cluster.kubectl("label", "tj", "late", "-n", ns, f"{naming.LABEL_QUEUE}=lq")
    cluster.wait_event(ns, "late", "QueuedAtNextStart", "Warning")
    cond = cluster.condition(ns, "late", "Queued") or {}
    assert cond.get("status") == "False" and "next start" in str(cond.get("message")), cond
    assert uids(cluster, ns, "late") == before and cluster.phase(ns, "late") == "Running"
    assert live_workloads(cluster, ns, "late") == []


def test_a_scheduler_name_naming_no_scheduler_is_said(cluster: Cluster, ns: str) -> None:
    """Workers whose schedulerName names no scheduler stay Pending with no word of any
    scheduler; the job sat Created saying nothing (121 s seen)."""
    body = job("nosched", replicas=1)
    body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["schedulerName"] = "no-such"
    cluster.create(body, ns)

    def said() -> bool:
        cond = cluster.condition(ns, "nosched", "WorkersPending") or {}
        return cond.get("status") == "True" and "schedulerName no-such" in str(cond.get("message"))

    wait_for(said, 60, "WorkersPending naming the scheduler")
    cluster.wait_event(ns, "nosched", "WorkersPending", "Warning")
    assert cluster.phase(ns, "nosched") == "Created"


def test_a_pod_group_someone_else_made_is_not_the_job_s(cluster: Cluster, ns: str) -> None:
    """A PodGroup `<job>-workers` made by someone else was taken as the job's (its
    AlreadyExists ignored): the workers joined the stranger's gang (minCount 5) and waited, the
    job Created without a word. Now the job is Blocked naming it, makes no worker, and starts
    once it is gone."""
    stranger = {
        "apiVersion": f"{naming.SCHEDULING_GROUP}/{naming.SCHEDULING_VERSION}",
        "kind": naming.POD_GROUP_KIND,
        "metadata": {"name": "g-workers", "namespace": ns},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 5}}},
    }
    cluster.api.create(stranger)
    body = job("g", replicas=2)
    body["spec"]["schedulingPolicy"] = {"minAvailable": 2}
    cluster.create(body, ns)

    def blocked() -> bool:
        cond = cluster.condition(ns, "g", "Blocked") or {}
        return cond.get("status") == "True" and "PodGroup g-workers" in str(cond.get("message"))

    wait_for(blocked, 20, "the job blocked, naming the PodGroup")
    assert cluster.pods(ns, "g", live=False) == []
    cluster.api.delete(naming.POD_GROUP_KIND, ns, "g-workers")
    running(cluster, ns, "g", 2)


def test_workers_on_the_node_s_network_are_placed_apart_or_said_to_wait(
    cluster: Cluster, ns: str
) -> None:
    """Two workers with `hostNetwork: true` on one node: the second sshd could not bind port 22,
    and the job sat Created saying every worker could run. Now no two share a node (their
    sshd port is declared), and a worker with no node left says so, in the scheduler's words."""
    body = job("hn", replicas=3)
    body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["hostNetwork"] = True
    cluster.create(body, ns)
    nodes = len(cluster.node_names())

    def placed_apart() -> bool:
        pods = [cluster.obj("Pod", ns, p) for p in cluster.pods(ns, "hn")]
        bound = [n for p in pods if (n := p["spec"].get("nodeName"))]
        return len(bound) == min(3, nodes) == len(set(bound))

    wait_for(placed_apart, 60, "one worker a node")
    if nodes < 3:

        def said() -> bool:
            cond = cluster.condition(ns, "hn", "WorkersPending") or {}
            return cond.get("status") == "True" and "port" in str(cond.get("message"))

        wait_for(said, 60, "the worker with no node left saying why")


def test_a_forged_queued_phase_never_restarts_a_running_job(cluster: Cluster, ns: str) -> None:
    """`status.phase: Queued` written (with status rights) over a running job without a queue
    label restarted it ("no longer queued ... starting"), every worker replaced."""
    cluster.create(job("forged", replicas=2), ns)
    running(cluster, ns, "forged", 2)
    before = uids(cluster, ns, "forged")
    cluster.api.patch(naming.JOB_KIND, ns, "forged", {"status": {"phase": "Queued"}}, sub="status")
    cluster.wait_event(ns, "forged", "StatusRepaired", "Warning")
    wait_for(lambda: cluster.phase(ns, "forged") == "Running", 10, "Running again")
    assert uids(cluster, ns, "forged") == before


def test_a_scheduling_policy_set_on_a_running_job_is_said_and_scales_on(
    cluster: Cluster, ns: str
) -> None:
    """schedulingPolicy added to a running job was taken silently: no PodGroup held the
    running workers, a ScaleOut's new worker was the lone member of a new gang and waited, and
    the ScaleOut failed at its timeout as "not ready", never naming the gang."""
    cluster.create(job("later", replicas=1, maxReplicas=3), ns)
    running(cluster, ns, "later", 1)
    policy = {"spec": {"schedulingPolicy": {"minAvailable": 1}}}
    cluster.api.patch(naming.JOB_KIND, ns, "later", policy)
    cluster.wait_event(ns, "later", "GangAtNextStart", "Warning")
    cluster.create(scaleout("more", "later", 1, timeout=60), ns)
    wait_for(lambda: cluster.phase(ns, "more", "ScaleOut") == "ScaleSucceeded", 60, "scaled")
    wait_for(lambda: len(cluster.hosts(ns, "later")) == 2, 10, "two workers listed")


def test_a_lowered_min_available_is_said_to_be_kept_by_the_pod_group(
    cluster: Cluster, ns: str
) -> None:
    """Lowering minAvailable left the PodGroup's minCount as it was, without a word (a
    PodGroup's policy cannot be changed: the apiserver refuses it)."""
    body = job("gm", replicas=2, minReplicas=1)
    body["spec"]["schedulingPolicy"] = {"minAvailable": 2}
    cluster.create(body, ns)
    running(cluster, ns, "gm", 2)
    cluster.api.patch(
        naming.JOB_KIND, ns, "gm", {"spec": {"schedulingPolicy": {"minAvailable": 1}}}
    )
    cluster.wait_event(ns, "gm", "PodGroupImmutable", "Warning")
    kept = cluster.condition(ns, "gm", "GangPolicyKept") or {}
    assert "keeps 2" in str(kept.get("message")), kept
    assert cluster.phase(ns, "gm") == "Running" and len(cluster.hosts(ns, "gm")) == 2


def test_a_scaler_of_a_suspended_job_is_answered_and_its_timeout_runs(
    cluster: Cluster, ns: str
) -> None:
    body = job("asleep", replicas=1, maxReplicas=3)
    body["spec"]["suspend"] = True
    cluster.create(body, ns)
    wait_for(lambda: cluster.phase(ns, "asleep") == "Suspended", 20, "suspended")
    scaler_waits_then_fails(cluster, ns, "asleep", "suspended")
    assert cluster.pods(ns, "asleep", live=False) == []


def scaler_waits_then_fails(cluster: Cluster, ns: str, job_name: str, why: str) -> None:
    """A ScaleOut `more` (timeout 8 s) of a job that does not run: it says it waits for its
    job (`why` in the message), then fails at its timeout."""
    cluster.create(scaleout("more", job_name, 1, timeout=8), ns)

    def waits() -> bool:
        cond = cluster.condition(ns, "more", "Waiting", "ScaleOut") or {}
        return cond.get("reason") == "JobNotRunning" and why in str(cond.get("message"))

    wait_for(waits, 10, "the scaler saying it waits for its job")
    wait_for(lambda: cluster.phase(ns, "more", "ScaleOut") == "ScaleFailed", 20, "its timeout")
