"""All or nothing: gang scheduling of a job's workers through Kubernetes' own Workload API
(scheduling.k8s.io/v1alpha2, kube-scheduler's GangScheduling plugin), on the real nodes.

Each worker asks for 900m CPU: the two nodes hold four such workers, so a gang of three fits
alone and two such gangs do not fit together."""

from __future__ import annotations

import json
from typing import Any

import pytest

from etoperator import naming
from tests.harness import Cluster, wait_for
from tests.support.manifests import job, scalein, scaleout

pytestmark = pytest.mark.integration


def gang_job(name: str, replicas: int, cpu: str = "900m", **spec: Any) -> dict[str, Any]:
    body = job(name, replicas=replicas, cleanPodPolicy="All", **spec)
    body["spec"]["schedulingPolicy"] = {"minAvailable": replicas}
    worker = body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
    worker["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return body


def bound(cluster: Cluster, ns: str, name: str) -> int:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"{naming.LABEL_JOB}={name},"
                          f"{naming.LABEL_ROLE}=worker", "-o", "json").stdout  # fmt: skip
    return sum(1 for p in json.loads(out)["items"] if p["spec"].get("nodeName"))


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
    # Sampled all along: never a part of a gang placed.
    assert all(a in (0, 3) and b in (0, 3) for a, b in seen), sorted(seen)
    pending: dict[str, Any] = wait_for(
        lambda: cluster.condition(ns, other, "GangPending") or {}, 30, "the waiting gang says why"
    )
    assert pending["status"] == "True" and pending["message"].startswith("0 of 3 workers placed")
    assert bound(cluster, ns, other) == 0
    cluster.wait_event(ns, other, "Unschedulable", "Warning")
    for name in (first, other):  # the Workload and PodGroup, owned by the job
        for res in ("workloads.scheduling.k8s.io", "podgroups.scheduling.k8s.io"):
            got = json.loads(cluster.kubectl("get", res, "-n", ns, "-o", "json").stdout)["items"]
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
    wait_for(lambda: running(cluster, ns, "gl", 2) and lost not in cluster.hosts(ns, "gl"), 60,
             "a replacement in the host list")  # fmt: skip
    assert bound(cluster, ns, "gl") == 2
    pending = cluster.condition(ns, "gl", "GangPending") or {}
    assert pending.get("status") != "True", pending
