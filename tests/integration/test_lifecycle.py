"""The real operator process against the real control plane and real nodes."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from localcluster.manifests import REFUSE_KEY, job
from tests.harness import Cluster, Timeout, wait_for
from tests.support.waits import passes, running

pytestmark = pytest.mark.integration


def test_creation_order_and_success(cluster: Cluster, ns: str) -> None:
    cluster.create(job("happy"), ns)
    # Children appear; the launcher only once both workers answer SSH with the job's key.
    wait_for(
        lambda: cluster.pods(ns, "happy", "worker") == ["happy-worker-0", "happy-worker-1"],
        20,
        "two workers",
    )
    # As long as `running` allows: both workers started and checked over SSH (19.5 s of the
    # 20 once allowed here, in a half's first minute on a node store just made).
    wait_for(lambda: cluster.pods(ns, "happy", "launcher"), 90, "the launcher")
    assert cluster.hosts(ns, "happy") == ["happy-worker-0", "happy-worker-1"]
    ready = cluster.condition(ns, "happy", "WorkersReady")
    assert ready is not None and ready["status"] == "True"
    running(cluster, ns, "happy")
    st = cluster.status(ns, "happy")
    assert st["currentWorkers"] == ["happy-worker-0", "happy-worker-1"]
    assert st["targetWorkers"] == ["happy-worker-0", "happy-worker-1"]
    for kind, obj in (
        ("Secret", "happy"),
        ("ConfigMap", "happy-config"),
        ("Service", "happy-worker-0"),
        ("Service", "happy-worker-1"),
        ("ServiceAccount", "happy-launcher"),
        ("Role", "happy-launcher"),
        ("RoleBinding", "happy-launcher"),
    ):
        got = cluster.api.get(kind, ns, obj)
        assert got is not None, f"{kind} {obj} missing"
        refs = got["metadata"]["ownerReferences"]
        assert refs[0]["kind"] == "TrainingJob" and refs[0]["controller"] is True
    cluster.finish(ns, "happy-launcher", 0)
    wait_for(lambda: cluster.phase(ns, "happy") == "Succeeded", 20, "Succeeded")
    # cleanPodPolicy Running (the default): the still-running workers go, the launcher stays.
    wait_for(lambda: cluster.pods(ns, "happy", "worker") == [], 20, "workers cleaned up")
    assert cluster.pods(ns, "happy", "launcher") == ["happy-launcher"]
    cluster.wait_event(ns, "happy", "Succeeded")


def test_launcher_waits_for_ssh_readiness(cluster: Cluster, ns: str) -> None:
    # worker-1 runs, but its sshd refuses the job's key: not ready, so no launcher.
    cluster.hold()
    cluster.create(job("gate"), ns)
    wait_for(lambda: len(cluster.pods(ns, "gate", "worker")) == 2, 10, "two workers made")
    cluster.annotate(ns, "gate-worker-1", REFUSE_KEY, "true")
    cluster.release()

    def phases() -> list[str]:
        pods = cluster.api.list("Pod", ns, "training-job-name=gate")
        return sorted(str((p.get("status") or {}).get("phase")) for p in pods)

    wait_for(lambda: phases() == ["Running", "Running"], 20, "both workers Running")
    # Give the operator passes to (wrongly) start the launcher; none may appear.
    start = passes(cluster)
    wait_for(lambda: passes(cluster) >= start + 5, 30, "five passes", interval=0.2)
    assert cluster.pods(ns, "gate", "launcher") == []
    assert cluster.hosts(ns, "gate") == []
    assert cluster.phase(ns, "gate") == "Created"
    # Once its sshd takes the key, the job starts.
    cluster.accept_key(ns, "gate-worker-1")
    running(cluster, ns, "gate")


def test_worker_failure_never_policy_leaves_host_list(cluster: Cluster, ns: str) -> None:
    cluster.create(job("wf", replicas=3), ns)
    running(cluster, ns, "wf", 3)
    cluster.finish(ns, "wf-worker-1", 137)
    wait_for(
        lambda: cluster.hosts(ns, "wf") == ["wf-worker-0", "wf-worker-2"],
        10,
        "worker-1 out of the host list",
    )
    # The failed pod is cleaned up, not replaced (restartPolicy Never), the job runs on.
    wait_for(lambda: cluster.pods(ns, "wf", "worker") == ["wf-worker-0", "wf-worker-2"], 10)
    wait_for(lambda: cluster.api.get("Service", ns, "wf-worker-1") is None, 10, "service gone")
    st = cluster.status(ns, "wf")
    assert st["currentWorkers"] == ["wf-worker-0", "wf-worker-2"]
    assert cluster.phase(ns, "wf") == "Running"
    cluster.wait_event(ns, "wf", "WorkerLost")


def test_worker_failure_replaced_under_new_index(cluster: Cluster, ns: str) -> None:
    cluster.create(job("wr", replicas=2, workerRestartPolicy="OnFailure"), ns)
    running(cluster, ns, "wr")
    cluster.api.delete("Pod", ns, "wr-worker-0")  # evicted / deleted
    wait_for(
        lambda: cluster.hosts(ns, "wr") == ["wr-worker-1", "wr-worker-2"],
        15,
        "replacement wr-worker-2 in the host list",
    )
    assert cluster.pods(ns, "wr", "worker") == ["wr-worker-1", "wr-worker-2"]
    cluster.wait_event(ns, "wr", "WorkerLost")
    cluster.wait_event(ns, "wr", "WorkerReplaced")
    assert cluster.status(ns, "wr")["lastWorkerIndex"] == 2


def test_launcher_failure_fails_job(cluster: Cluster, ns: str) -> None:
    cluster.create(job("lf", cleanPodPolicy="All"), ns)
    running(cluster, ns, "lf")
    cluster.finish(ns, "lf-launcher", 1)
    wait_for(lambda: cluster.phase(ns, "lf") == "Failed", 10, "Failed")
    cond = cluster.condition(ns, "lf", "Failed")
    assert cond and cond["reason"] == "LauncherFailed" and "exit code 1" in cond["message"]
    # cleanPodPolicy All: the launcher goes too.
    wait_for(lambda: cluster.pods(ns, "lf") == [], 10, "every pod deleted")
    assert cluster.status(ns, "lf").get("completionTime")


def test_restart_on_failure_with_backoff(cluster: Cluster, ns: str) -> None:
    cluster.create(job("rs", restartPolicy="OnFailure", backoffLimit=1), ns)
    running(cluster, ns, "rs")
    cluster.finish(ns, "rs-launcher", 2)
    # A fresh run: new indices, a host list rebuilt from scratch, restartCount 1.
    wait_for(lambda: cluster.status(ns, "rs").get("restartCount") == 1, 10, "restartCount 1")
    wait_for(
        lambda: (
            cluster.phase(ns, "rs") == "Running"
            and cluster.hosts(ns, "rs") == ["rs-worker-2", "rs-worker-3"]
        ),
        20,
        "second run",
    )
    assert cluster.pods(ns, "rs", "worker") == ["rs-worker-2", "rs-worker-3"]
    launcher = cluster.obj("Pod", ns, "rs-launcher")
    assert launcher and launcher["status"]["phase"] == "Running"
    # Second failure: the limit is reached and the job stays Failed.
    cluster.finish(ns, "rs-launcher", 2)
    wait_for(lambda: cluster.phase(ns, "rs") == "Failed", 10, "Failed after backoff")
    cond = cluster.condition(ns, "rs", "Failed")
    assert cond and "backoffLimit 1 reached" in cond["message"]
    assert cluster.status(ns, "rs")["restartCount"] == 1


@pytest.mark.parametrize(
    "policy,left",
    [
        ("All", []),
        ("Running", ["cp-launcher"]),
        ("None", ["cp-launcher", "cp-worker-0", "cp-worker-1"]),
    ],
)
def test_clean_pod_policy(cluster: Cluster, ns: str, policy: str, left: list[str]) -> None:
    cluster.create(job("cp", cleanPodPolicy=policy), ns)
    running(cluster, ns, "cp")
    cluster.finish(ns, "cp-launcher", 0)
    wait_for(lambda: cluster.phase(ns, "cp") == "Succeeded", 10)
    wait_for(lambda: cluster.pods(ns, "cp") == left, 10, f"pods left by {policy}")

    def services() -> list[str]:
        return sorted(s["metadata"]["name"] for s in cluster.api.list("Service", ns))

    wait_for(lambda: services() == [p for p in left if "worker" in p], 10, "services with pods")


def test_launcher_deleted_fails_job_by_default(cluster: Cluster, ns: str) -> None:
    cluster.create(job("ld"), ns)
    running(cluster, ns, "ld")
    cluster.api.delete("Pod", ns, "ld-launcher")
    wait_for(lambda: cluster.phase(ns, "ld") == "Failed", 10, "Failed, not stuck Running")
    cond = cluster.condition(ns, "ld", "Failed")
    assert cond and cond["reason"] == "LauncherLost"


def test_launcher_deleted_is_recreated_with_always(cluster: Cluster, ns: str) -> None:
    cluster.create(job("la", launcherRestartPolicy="Always"), ns)
    running(cluster, ns, "la")
    uid = cluster.obj("Pod", ns, "la-launcher")["metadata"]["uid"]
    cluster.api.delete("Pod", ns, "la-launcher")
    wait_for(
        lambda: (
            (cluster.api.get("Pod", ns, "la-launcher") or {}).get("metadata", {}).get("uid")
            not in (None, uid)
        ),
        10,
        "a new launcher",
    )
    wait_for(lambda: cluster.obj("Pod", ns, "la-launcher")["status"]["phase"] == "Running")
    assert cluster.phase(ns, "la") == "Running"
    cluster.wait_event(ns, "la", "LauncherRecreated")


def test_suspend_and_resume(cluster: Cluster, ns: str) -> None:
    cluster.create(job("sus"), ns)
    running(cluster, ns, "sus")
    ann = "job-supervisor.kube-ai.io/job-suspended"
    cluster.api.patch("TrainingJob", ns, "sus", {"metadata": {"annotations": {ann: "true"}}})
    wait_for(lambda: cluster.phase(ns, "sus") == "Suspended", 10)
    wait_for(lambda: cluster.pods(ns, "sus") == [], 10, "all pods deleted")
    # Emptied once the launcher is gone (the training could save until then).
    wait_for(lambda: cluster.hosts(ns, "sus") == [], 10, "the host list emptied")
    cluster.api.patch("TrainingJob", ns, "sus", {"metadata": {"annotations": {ann: None}}})
    wait_for(lambda: cluster.phase(ns, "sus") == "Running", 20, "resumed")
    assert cluster.hosts(ns, "sus") == ["sus-worker-2", "sus-worker-3"]
    assert cluster.status(ns, "sus").get("restartCount", 0) == 0
    cluster.wait_event(ns, "sus", "Suspended")
    cluster.wait_event(ns, "sus", "Resumed")


def test_job_deletion_collects_children(cluster: Cluster, ns: str) -> None:
    cluster.create(job("gc"), ns)
    running(cluster, ns, "gc")
    uid = cluster.job(ns, "gc")["metadata"]["uid"]
    kinds = ("Pod", "Service", "ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding")

    def owned() -> list[str]:
        return [
            f"{kind}/{o['metadata']['name']}"
            for kind in kinds
            for o in cluster.api.list(kind, ns)
            if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    assert len(owned()) >= 8  # pods, services, ConfigMap, Secret, launcher account and RBAC
    cluster.api.delete("TrainingJob", ns, "gc")
    wait_for(lambda: cluster.api.get("TrainingJob", ns, "gc") is None, 10, "job gone")
    # The garbage collector (kube-controller-manager) removes every child, asynchronously.
    wait_for(lambda: owned() == [], 30, "children collected")


def test_a_namespace_going_away_takes_its_jobs_without_a_word(cluster: Cluster) -> None:
    """Deleting a namespace removes its pods before (or while) its jobs: the jobs are not failed
    as LauncherLost, their scalers not ended as JobFinished, on their way out."""
    ns = cluster.new_namespace()
    names = [f"ns{i}" for i in range(3)]
    for name in names:
        cluster.create(job(name), ns)
    for name in names:
        running(cluster, ns, name)
    seen: set[str] = set()

    def gone() -> bool:
        left = [cluster.api.get("TrainingJob", ns, n) for n in names]
        seen.update(str((j.get("status") or {}).get("phase")) for j in left if j)
        return not any(left)

    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(gone, 60, "the jobs gone with their namespace", interval=0.02)
    assert seen <= {"Running"}, seen


@pytest.mark.faults
def test_workers_start_while_the_launchers_rbac_is_made(cluster: Cluster, ns: str) -> None:
    """The apiserver makes a Role or a RoleBinding slowly where a namespace holds many (it
    lists every binding there to rule out an escalation: 0.2 s each with 150 jobs, over 1 s at
    p99). Only the launcher needs its account, Role and binding: the workers are made while
    they are, and the launcher waits for them."""
    opened = cluster.proxy.gate("create", "rolebindings")
    try:
        cluster.create(job("slowrb", replicas=2), ns)
        wait_for(lambda: len(cluster.pods(ns, "slowrb", "worker")) == 2, 10, "the workers")
        ready = wait_for(lambda: cluster.condition(ns, "slowrb", "WorkersReady") or {}, 60)
        assert ready["status"] == "True"
        assert cluster.api.get("RoleBinding", ns, "slowrb-launcher") is None
        with pytest.raises(Timeout):  # passes meanwhile (one a second at least) leave it so
            wait_for(lambda: cluster.pods(ns, "slowrb", "launcher"), 3, "no launcher")
    finally:
        opened.set()
        cluster.proxy.clear()
    running(cluster, ns, "slowrb")
    assert cluster.api.get("RoleBinding", ns, "slowrb-launcher") is not None


def test_an_operator_of_chosen_namespaces_forgets_the_jobs_of_one_deleted(
    cluster: Cluster,
) -> None:
    """Run with -n, the operator starts at once (kopf listed every namespace to find the
    chosen ones, and the 403 of an install confined to them was retried for minutes), and a
    deleted namespace is not asked about again and again (a loop per vanished job was seen:
    a GET of the namespace per job per resync)."""
    ns = cluster.new_namespace()
    forgets_a_deleted_namespace(cluster, ns, ["-n", ns, "--resync", "1"])


FOLLOW_NAMESPACES = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: etoperator-test-follow-namespaces}
rules: [{apiGroups: [""], resources: [namespaces], verbs: [list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: etoperator-test-follow-namespaces}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole,
          name: etoperator-test-follow-namespaces}
subjects: [{kind: ServiceAccount, name: etoperator, namespace: etoperator-system}]
"""


def test_a_namespace_pattern_needs_the_right_to_follow_namespaces_then_works(
    cluster: Cluster,
) -> None:
    """`-n 'team-*'` has kopf follow the namespaces that match, which needs list and watch on
    namespaces: without them it retried the list for ever and served nothing (its log said
    only "forbidden"). The operator now stops at once and says what to grant; granted, it
    serves the matching namespaces, and forgets the jobs of one deleted."""
    ns = cluster.new_namespace()
    extra = ["-n", ns[:-1] + "*", "--resync", "1"]
    with cluster.operators_instead(["pattern"], extra) as ours:
        wait_for(lambda: not ours["pattern"].alive(), 30, "the operator stopped")
        said = ours["pattern"].log.read_text()
        assert "needs list and watch on namespaces cluster-wide" in said, said[-2000:]
    cluster.kubectl("apply", "-f", "-", input=FOLLOW_NAMESPACES)
    try:
        forgets_a_deleted_namespace(cluster, ns, extra)
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", input=FOLLOW_NAMESPACES, check=False)


def forgets_a_deleted_namespace(cluster: Cluster, ns: str, extra: list[str]) -> None:
    with cluster.operators_instead(["chosen"], extra) as ours:
        for name in ("gone0", "gone1"):
            cluster.create(job(name), ns)
        for name in ("gone0", "gone1"):
            running(cluster, ns, name)
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
        wait_for(lambda: cluster.api.get("TrainingJob", ns, "gone0") is None, 60, "jobs gone")
        wait_for(lambda: not namespace_exists(cluster, ns), 60, "the namespace gone")
        since = datetime.now(UTC)
        # The window is the scenario: six resyncs of the operator's, each a pass of every job
        # its caches still hold.
        end = time.monotonic() + 6
        wait_for(lambda: time.monotonic() > end, 10, "six resyncs")
        asked = [
            ev for ev in cluster.cp.audit()
            if ev.get("userAgent", "").startswith("etoperator/chosen")
            and (ev.get("objectRef") or {}).get("resource") == "namespaces"
            and received(ev) >= since
        ]  # fmt: skip
        assert len(asked) <= 2, f"{len(asked)} GETs of the gone namespace in 6 s"
        assert ours["chosen"].alive()


def namespace_exists(cluster: Cluster, ns: str) -> bool:
    return cluster.kubectl("get", "namespace", ns, check=False).returncode == 0


def received(ev: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(ev["requestReceivedTimestamp"]).replace("Z", "+00:00"))
