"""All or nothing: gang scheduling of a job's workers through Kubernetes' own Workload API
(scheduling.k8s.io/v1alpha2, kube-scheduler's GangScheduling plugin), on the real nodes.

Each worker asks for 900m CPU: the two nodes hold four such workers, so a gang of three fits
alone and two such gangs do not fit together."""

from __future__ import annotations

import json
from typing import Any

import pytest

from etoperator import naming
from localcluster.manifests import job, scalein, scaleout
from localcluster.queues import make_queue
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.integration


def gang_job(name: str, replicas: int, cpu: str = "900m", **spec: Any) -> dict[str, Any]:
    body = job(name, replicas=replicas, cleanPodPolicy="All", **spec)
    body["spec"]["schedulingPolicy"] = {"minAvailable": replicas}
    worker = body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
    worker["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return body


def bound(cluster: Cluster, ns: str, name: str) -> int:
    labels = naming.selector({naming.LABEL_JOB: name, naming.LABEL_ROLE: "worker"})
    return sum(1 for p in cluster.api.list("Pod", ns, labels) if p["spec"].get("nodeName"))


def running(cluster: Cluster, ns: str, name: str, workers: int) -> bool:
    return cluster.phase(ns, name) == "Running" and len(cluster.hosts(ns, name)) == workers


def test_two_gangs_that_fit_alone_run_whole_one_after_the_other(cluster: Cluster, ns: str) -> None:
    cluster.create(gang_job("ga", 3), ns)
    cluster.create(gang_job("gb", 3), ns)
    seen: set[tuple[int, int]] = set()

    def one_runs() -> str:
        seen.add((bound(cluster, ns, "ga"), bound(cluster, ns, "gb")))
        return next((n for n in ("ga", "gb") if running(cluster, ns, n, 3)), "")

    first = wait_for(one_runs, 90, "one gang running whole")
    other = "gb" if first == "ga" else "ga"
    # Sampled all along: the gang that waits never held a node, so the two never shared the
    # room (a gang's pods are bound one by one once all are permitted: a sample may catch the
    # placed gang part bound, on its way to whole).
    waiting = 1 if first == "ga" else 0
    assert all(s[waiting] == 0 for s in seen), sorted(seen)
    pending: dict[str, Any] = wait_for(
        lambda: cluster.condition(ns, other, "GangPending") or {}, 30, "the waiting gang says why"
    )
    assert pending["status"] == "True" and pending["message"].startswith("0 of 3 workers placed")
    assert bound(cluster, ns, other) == 0
    cluster.wait_event(ns, other, "Unschedulable", "Warning")
    for name in (first, other):  # the Workload and PodGroup, owned by the job
        for res in (naming.GANG_WORKLOAD, naming.POD_GROUP_KIND):
            got = cluster.api.list(res, ns)
            owners = [r["name"] for o in got for r in o["metadata"]["ownerReferences"]]
            assert name in owners, (res, owners)
    cluster.finish(ns, f"{first}-launcher", 0)
    wait_for(lambda: running(cluster, ns, other, 3), 90, "the second gang running whole")
    assert (cluster.condition(ns, other, "GangPending") or {}).get("status") == "False"


def test_a_placed_gang_grows_at_once_and_never_shrinks_below_its_minimum(
    cluster: Cluster, ns: str
) -> None:
    cluster.create(gang_job("gg", 2, cpu="100m", maxReplicas=3), ns)
    wait_for(lambda: running(cluster, ns, "gg", 2), 60, "running")
    cluster.create(scaleout("gg-more", "gg", 1, timeout=30), ns)
    wait_for(lambda: cluster.phase(ns, "gg-more", "ScaleOut") == "ScaleSucceeded", 30, "grown")
    assert bound(cluster, ns, "gg") == 3
    cluster.create(scalein("gg-less", "gg", count=2), ns)
    wait_for(lambda: cluster.phase(ns, "gg-less", "ScaleIn") == "ScaleFailed", 20, "refused")
    cond = cluster.condition(ns, "gg-less", "ScaleFailed", "ScaleIn") or {}
    assert "minAvailable 2" in str(cond.get("message")), cond
    assert running(cluster, ns, "gg", 3)


def test_a_lost_worker_of_a_placed_gang_is_replaced_without_waiting_for_the_group(
    cluster: Cluster, ns: str
) -> None:
    """A worker of a placed gang fails: its replacement joins the group and is placed at once
    (the group's other member stays bound), as for any job."""
    cluster.create(gang_job("gl", 2, cpu="100m", workerRestartPolicy="Always"), ns)
    wait_for(lambda: running(cluster, ns, "gl", 2), 60, "running")
    lost = cluster.hosts(ns, "gl")[0]
    cluster.finish(ns, lost, 1)

    def replaced() -> bool:  # one read of the host list: two could see it before and after
        hosts = cluster.hosts(ns, "gl")
        return cluster.phase(ns, "gl") == "Running" and len(hosts) == 2 and lost not in hosts

    wait_for(replaced, 60, "a replacement in the host list")
    assert bound(cluster, ns, "gl") == 2
    pending = cluster.condition(ns, "gl", "GangPending") or {}
    assert pending.get("status") != "True", pending


def test_a_queued_gang_is_admitted_first_then_placed_whole_and_survives_a_suspension(
    cluster: Cluster, ns: str
) -> None:
    """Beside Kueue: no pod until the queue admits the job, then the gang placed whole; a
    suspension takes every pod away and the resumed run's workers join the group again."""
    make_queue(cluster, ns, pods=2)  # not enough for a launcher and two workers
    body = gang_job("gq", 2, cpu="100m")
    body["metadata"]["labels"] = {naming.LABEL_QUEUE: "lq"}
    body["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "100m"}
    }
    cluster.create(body, ns)
    wait_for(lambda: (cluster.condition(ns, "gq", "Queued") or {}).get("status") == "True", 20,
             "queued")  # fmt: skip
    assert cluster.pods(ns, "gq", live=False) == []
    cluster.kubectl("patch", "clusterqueue", f"cq-{ns}", "--type=json", "-p", json.dumps(
        [{"op": "replace", "value": "300m",
          "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"}]))  # fmt: skip
    wait_for(lambda: running(cluster, ns, "gq", 2), 60, "admitted, then placed whole")
    group = naming.pod_group_name("gq")
    for pod in cluster.pods(ns, "gq", role="worker"):
        assert cluster.obj("Pod", ns, pod)["spec"]["schedulingGroup"] == {"podGroupName": group}
    cluster.api.patch(naming.JOB_KIND, ns, "gq", {"spec": {"suspend": True}})
    wait_for(lambda: cluster.phase(ns, "gq") == "Suspended" and not cluster.pods(ns, "gq"), 30,
             "suspended")  # fmt: skip
    cluster.api.patch(naming.JOB_KIND, ns, "gq", {"spec": {"suspend": False}})
    wait_for(lambda: running(cluster, ns, "gq", 2), 90, "resumed, placed whole again")
    assert bound(cluster, ns, "gq") == 2


def test_a_scaler_of_a_gang_that_cannot_be_placed_says_so_and_fails_at_its_timeout(
    cluster: Cluster, ns: str
) -> None:
    """A gang of five 900m workers never fits the two nodes: a ScaleOut of it waits, saying it
    waits for the gang (not started: its job does not run), and fails at its timeout; no
    worker of the gang was ever bound."""
    cluster.create(gang_job("big", 5), ns)
    wait_for(lambda: (cluster.condition(ns, "big", "GangPending") or {}).get("status") == "True",
             60, "the gang says it waits")  # fmt: skip
    cluster.create(scaleout("more", "big", 1, timeout=8), ns)

    def waits() -> bool:
        cond = cluster.condition(ns, "more", "Waiting", "ScaleOut") or {}
        return cond.get("reason") == "JobNotRunning" and "placed" in str(cond.get("message"))

    wait_for(waits, 15, "the scaler saying it waits for the gang")
    wait_for(lambda: cluster.phase(ns, "more", "ScaleOut") == "ScaleFailed", 20, "its timeout")
    failed = str((cluster.condition(ns, "more", "ScaleFailed", "ScaleOut") or {}).get("message"))
    assert "did not run within the 8s timeout" in failed, failed
    assert bound(cluster, ns, "big") == 0
    assert cluster.job(ns, "big")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 5
