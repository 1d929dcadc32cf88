"""What users type works on the local cluster as on any other: the operator runs as deploy/
installs it, and kubectl exec, logs (-f, --tail, --since), describe and get events answer."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from localcluster.cluster import OPERATOR_NS
from localcluster.tour import JOB
from tests.harness import ROOT, Chain, wait_for

pytestmark = pytest.mark.fullchain


def test_the_operator_runs_as_deployed(chain: Chain) -> None:
    """Two replicas Ready (their liveness and the apiserver through in-cluster config), one of
    them holding the Lease."""
    c = chain
    deploy = json.loads(
        c.kubectl("get", "deploy/etoperator", "-n", OPERATOR_NS, "-o", "json").stdout
    )
    assert deploy["status"].get("readyReplicas") == 2
    pods = json.loads(
        c.kubectl("get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=etoperator",
                  "-o", "json").stdout
    )["items"]  # fmt: skip
    assert len(pods) == 2
    assert all(p["status"]["containerStatuses"][0]["restartCount"] == 0 for p in pods)
    leader = wait_for(c.operator.leader, 30, "a replica holding the Lease")
    assert leader in {p["metadata"]["name"] for p in pods}


def test_exec_logs_describe_and_events(chain: Chain) -> None:
    c = chain
    ns = c.new_namespace()
    c.kubectl("-n", ns, "create", "-f", str(ROOT / "examples/training_job.yaml"))
    launcher, w0, w1 = f"{JOB}-launcher", f"{JOB}-worker-0", f"{JOB}-worker-1"
    wait_for(lambda: "STEP 20 " in c.pod_log(ns, launcher), 120, "training", interval=0.5)

    # exec into a worker: its peers' names resolve through cluster DNS (headless Services).
    out = c.kubectl("-n", ns, "exec", w0, "--", "getent", "hosts", w1).stdout
    ip = json.loads(c.kubectl("-n", ns, "get", "pod", w1, "-o", "json").stdout)["status"]["podIP"]
    assert out.split()[0] == ip, out
    # exec into the launcher: ssh reaches a worker by name with the job's key, as horovodrun does.
    out = c.kubectl("-n", ns, "exec", launcher, "--", "ssh", w1, "hostname").stdout
    assert out.strip() == w1

    # logs: --tail, --since, -f.
    tail = c.kubectl("-n", ns, "logs", launcher, "--tail=3").stdout.splitlines()
    assert len(tail) == 3 and all("STEP" in line for line in tail), tail
    since = c.kubectl("-n", ns, "logs", launcher, "--since=1s").stdout.splitlines()
    everything = c.kubectl("-n", ns, "logs", launcher).stdout.splitlines()
    assert 0 < len(since) < len(everything)
    assert c.local.cp is not None
    follow = subprocess.Popen(
        [str(c.local.cp.kubectl_path()), "--kubeconfig", str(c.kubeconfig), "-n", ns,
         "logs", "-f", "--tail=0", launcher],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        lines = [follow.stdout.readline() for _ in range(3)]
        assert all("STEP" in line for line in lines), lines
    finally:
        follow.kill()
        follow.wait()

    described = c.kubectl("-n", ns, "describe", "tj", JOB).stdout
    assert "WorkersReady" in described and "LauncherCreated" in described
    events = c.kubectl("-n", ns, "get", "events", "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"Scheduled", "Started", "WorkersReady", "Running"} <= reasons, reasons
    c.kubectl("-n", ns, "delete", "tj", JOB, "--wait=false")


def test_a_queued_job_on_a_cluster_without_kueue_says_so(chain: Chain) -> None:
    """Labelled for a queue where no Kueue is installed: no pod, and the job says why (once,
    with a Warning), instead of starting past the queue or retrying in silence."""
    c = chain
    ns = c.new_namespace()
    body = yaml.safe_load((ROOT / "examples/training_job.yaml").read_text())
    body["metadata"]["name"] = "queued"
    body["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "team-a"
    c.kubectl_create(ns, body)
    cond: dict[str, str] = wait_for(
        lambda: c.condition(ns, "queued", "Queued") or {}, 30, "the Queued condition"
    )
    assert (cond["status"], cond["reason"]) == ("True", "KueueNotInstalled"), cond
    assert "kueue.x-k8s.io/v1beta2" in cond["message"]
    assert c.phase(ns, "queued") == "Queued"
    assert c.pods(ns, "queued", live=False) == []
    c.wait_event(ns, "queued", "KueueNotInstalled", "Warning")


def test_a_gang_job_on_a_cluster_without_the_workload_api_says_so(chain: Chain) -> None:
    """spec.schedulingPolicy where scheduling.k8s.io/v1alpha2 is not served: at once a clear
    condition and no worker, not a retry loop of refused creates."""
    c = chain
    ns = c.new_namespace()
    body = yaml.safe_load((ROOT / "examples/training_job.yaml").read_text())
    body["metadata"]["name"] = "gang"
    body["spec"]["schedulingPolicy"] = {"minAvailable": 2}
    c.kubectl_create(ns, body)
    cond: dict[str, str] = wait_for(
        lambda: c.condition(ns, "gang", "GangPending") or {}, 30, "the GangPending condition"
    )
    assert (cond["status"], cond["reason"]) == ("True", "WorkloadAPIUnavailable"), cond
    assert "scheduling.k8s.io/v1alpha2" in cond["message"]
    assert c.pods(ns, "gang", live=False) == []
    c.wait_event(ns, "gang", "WorkloadAPIUnavailable", "Warning")
