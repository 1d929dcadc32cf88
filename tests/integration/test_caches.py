"""Passes read the watch caches: a quiet job costs the apiserver nothing, and a cache that is
behind the server is waited out, never acted on."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from etoperator import naming
from etoperator.builders.common import Owner
from localcluster.cluster import OPERATOR_USER
from localcluster.manifests import job, scalein, scaleout
from tests.harness import Cluster, wait_for
from tests.support.waits import pass_attempts, passes, running, settled

pytestmark = pytest.mark.integration


def operator_requests(cluster: Cluster, ns: str, since: set[str]) -> list[dict[str, Any]]:
    """Requests the operator made about namespace `ns` (watch streams aside) not in `since`."""
    return [
        ev
        for ev in cluster.cp.audit()
        if ev["auditID"] not in since
        and (ev.get("user") or {}).get("username") == OPERATOR_USER
        and (ev.get("objectRef") or {}).get("namespace") == ns
        and ev.get("verb") != "watch"
    ]


def seen(cluster: Cluster) -> set[str]:
    return {ev["auditID"] for ev in cluster.cp.audit()}


def quiet(cluster: Cluster, ns: str, seconds: float = 2.0) -> set[str]:
    """The audit log once the operator has made no request about `ns` for `seconds` (the log
    is written in batches within a second: a request made just before may show up later)."""
    ids, at = [seen(cluster)], [time.monotonic()]

    def settled() -> bool:
        now = seen(cluster)
        if operator_requests(cluster, ns, ids[0]):
            ids[0], at[0] = now, time.monotonic()
            return False
        return time.monotonic() - at[0] >= seconds

    wait_for(settled, 30, f"the operator quiet about {ns} for {seconds}s", interval=0.25)
    return seen(cluster)


def test_a_quiet_job_costs_no_request(cluster: Cluster, ns: str) -> None:
    cluster.create(job("quiet", replicas=2), ns)
    running(cluster, ns, "quiet")
    before, start = quiet(cluster, ns), passes(cluster)
    # The window: four resync passes of the job (every 3 s here); the audit log is written
    # within a second, so a fifth pass ends it.
    wait_for(lambda: passes(cluster) >= start + 5, 30, "five passes", interval=0.5)
    made = operator_requests(cluster, ns, before)
    assert made == [], [(e["verb"], e["requestURI"]) for e in made]
    assert cluster.phase(ns, "quiet") == "Running"


@pytest.mark.faults
def test_a_cache_behind_the_server_is_waited_out(cluster: Cluster, ns: str) -> None:
    cluster.create(job("behind", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "behind")
    # The operator stops hearing of job changes (its own status writes included).
    cluster.proxy.held.add("trainingjobs")
    try:
        cluster.create(scaleout("grow", "behind", 1), ns)
        wait_for(lambda: "behind-worker-2" in cluster.pods(ns, "behind"), 10, "the new worker")
        # Passes keep coming (pods change, resyncs), each from a job status older than the
        # operator's own write: none may plan the scale again. The job's own are not run
        # (its view is behind that write), so they count as attempts; bounded, as any wait.
        start, deadline = pass_attempts(cluster), time.monotonic() + 90
        while pass_attempts(cluster) < start + 20:
            assert time.monotonic() < deadline, "passes stopped coming"
            assert cluster.status(ns, "grow", "ScaleOut").get("addPods") == ["behind-worker-2"]
            assert cluster.pods(ns, "behind", "worker") == [
                "behind-worker-0", "behind-worker-1", "behind-worker-2",
            ]  # fmt: skip
    finally:
        cluster.proxy.held.discard("trainingjobs")
    wait_for(lambda: cluster.phase(ns, "grow", "ScaleOut") == "ScaleSucceeded", 20)
    assert cluster.hosts(ns, "behind") == ["behind-worker-0", "behind-worker-1", "behind-worker-2"]
    assert cluster.status(ns, "behind")["lastWorkerIndex"] == 2


@pytest.mark.faults
def test_a_host_list_write_the_cache_has_not_shown_yet_is_known_without_it(
    cluster: Cluster, ns: str
) -> None:
    """The operator's ConfigMap watch falls behind, its own host-list writes unseen: a scale
    still goes on from what it wrote (it waited for the watch, writing the list again every
    pass), and a scale that undoes the last one writes the list back."""
    cluster.create(job("cmlag", replicas=2, maxReplicas=3), ns)
    running(cluster, ns, "cmlag")
    cluster.proxy.held.add("configmaps")
    try:
        cluster.create(scaleout("grow", "cmlag", 1), ns)
        settled(cluster, ns, "ScaleOut", "grow", "ScaleSucceeded", timeout=60)
        assert cluster.hosts(ns, "cmlag") == [f"cmlag-worker-{i}" for i in range(3)]
        # The cache still shows two hosts: going back to them is a write all the same.
        cluster.create(scalein("shrink", "cmlag", pod_names=["cmlag-worker-2"]), ns)
        settled(cluster, ns, "ScaleIn", "shrink", "ScaleSucceeded", timeout=60)
        two = ["cmlag-worker-0", "cmlag-worker-1"]
        assert cluster.hosts(ns, "cmlag") == two
        wait_for(lambda: cluster.pods(ns, "cmlag", "worker") == two, 30, "the victim gone")
    finally:
        cluster.proxy.held.discard("configmaps")


def annotate_and_wait_for_a_pass(cluster: Cluster, ns: str, job_name: str, note: str) -> None:
    start = passes(cluster)
    cluster.kubectl("annotate", "-n", ns, "trainingjob", job_name, note, "--overwrite")
    wait_for(lambda: passes(cluster) > start, 10, "a pass")


def audit_caught_up(cluster: Cluster, ns: str) -> None:
    """Wait until the audit log (written in batches) holds everything asked so far: a request
    of a service account's, which the log records, is in it."""
    token = cluster.kubectl("create", "token", "default", "-n", ns).stdout.strip()
    marker = f"audit-marker-{time.monotonic_ns()}"
    url = f"{cluster.cp.url}/api/v1/namespaces/{ns}/configmaps/{marker}"
    auth = f"Authorization: Bearer {token}"
    subprocess.run(["curl", "-s", "--cacert", str(cluster.cp.ca), "-H", auth, url], check=True)
    wait_for(lambda: any(marker in str(e.get("requestURI")) for e in cluster.cp.audit()), 10)


@pytest.mark.faults
def test_a_pod_found_existing_is_not_asked_for_again_while_the_cache_lags(
    cluster: Cluster, ns: str
) -> None:
    """A worker that exists but that the pod cache does not show yet (made by a replica that
    died, say) is refused once; later passes wait for the cache instead of asking again."""
    cluster.proxy.held.update({"trainingjobs", "pods"})
    try:
        made = cluster.create(job("lag", replicas=2), ns)
        owner = Owner(naming.JOB_KIND, "lag", made["metadata"]["uid"])
        worker = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "lag-worker-0",
                "namespace": ns,
                "labels": naming.worker_labels("lag", 0),
                "ownerReferences": [owner.reference()],
            },
            "spec": {"containers": [{"name": "worker", "image": "trainer:test"}]},
        }
        cluster.api.create(worker)
        since = seen(cluster)
        cluster.proxy.held.discard("trainingjobs")
        wait_for(lambda: "lag-worker-1" in cluster.pods(ns, "lag"), 10, "the other worker")
        for i in range(5):  # each change of the job is a pass that still sees no pod
            annotate_and_wait_for_a_pass(cluster, ns, "lag", f"poke={i}")
        audit_caught_up(cluster, ns)
        refused = [
            ev
            for ev in operator_requests(cluster, ns, since)
            if ev["verb"] == "create"
            and ev["objectRef"].get("resource") == "pods"
            and ev["responseStatus"]["code"] == 409
        ]
        assert len(refused) == 1, f"{len(refused)} refused creates of a pod that exists"
    finally:
        cluster.proxy.held.difference_update({"trainingjobs", "pods"})
