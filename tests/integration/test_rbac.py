"""deploy/rbac.yaml grants exactly what the operator uses. The operator runs under its
ServiceAccount's token with deploy/rbac.yaml applied, so the real apiserver refuses anything
missing; what it did use is read from the apiserver's audit log and compared with the role."""

from __future__ import annotations

from functools import partial

import pytest
import yaml

from localcluster.cluster import OPERATOR_USER
from localcluster.manifests import job, scalein, scaleout
from localcluster.queues import KUEUE, live_workloads, make_queue, queued_job
from tests.harness import ROOT, Cluster, wait_for
from tests.support.horovod import horovod_process

pytestmark = pytest.mark.integration


def granted(kinds: tuple[str, ...] = ("ClusterRole", "Role")) -> set[tuple[str, str, str]]:
    """What deploy/rbac.yaml grants: the ClusterRole (the jobs' work) and the Role (the Lease
    of leader election, used in tests/integration/test_leader.py)."""
    docs = list(yaml.safe_load_all((ROOT / "deploy/rbac.yaml").read_text()))
    return {
        (verb, group, res)
        for role in docs
        if role["kind"] in kinds
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }


# Checks the apiserver makes inside one request, which the audit log does not list apart:
# a WebSocket pods/exec (an HTTP GET) is authorized as `get` and also as `create`; a child with
# `blockOwnerDeletion` needs `update` on its owner's finalizers, and setting an ownerReference
# on an existing object (adopting a scaler: the operator's only patch of a scaler) needs
# `delete` on it (OwnerReferencesPermissionEnforcement, on in the local control plane).
GROUP = "kai.alibabacloud.com"
IMPLIED = {
    ("get", "", "pods/exec"): {("create", "", "pods/exec")},
    ("create", "", "pods"): {("update", GROUP, "trainingjobs/finalizers")},
    ("patch", GROUP, "scaleouts"): {("delete", GROUP, "scaleouts")},
    ("patch", GROUP, "scaleins"): {("delete", GROUP, "scaleins")},
}


def audited(cluster: Cluster) -> set[tuple[str, str, str]]:
    """(verb, group, resource[/subresource]) of every request the operator made."""
    used: set[tuple[str, str, str]] = set()
    for ev in cluster.cp.audit():
        user = ev.get("user") or {}
        ref = ev.get("objectRef") or {}
        if user.get("username") != OPERATOR_USER:
            continue
        res = str(ref.get("resource", "")) + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        if res:
            used.add((str(ev["verb"]), str(ref.get("apiGroup", "")), res))
    for got, implies in IMPLIED.items():
        if got in used:
            used |= implies
    return used


def test_operator_uses_exactly_the_granted_permissions(cluster: Cluster, ns: str) -> None:
    # A scenario that walks every path: orphan scaler, creation, kubectl scale (the operator
    # creates a scaler), scale in, worker loss and replacement, the end with cleanup.
    cluster.create(scaleout("first", "rb", 1), ns)
    cluster.create(scalein("waits", "no-such-job", count=1), ns)
    cluster.create(scaleout("waits-too", "no-such-job", 1), ns)
    for kind, name in (("ScaleIn", "waits"), ("ScaleOut", "waits-too")):
        wait_for(partial(cluster.condition, ns, name, "Waiting", kind), 10)
    # Objects in the way of the job's children: refused, reported, never adopted.
    for kind, spec in (
        ("Pod", {"containers": [{"name": "c", "image": "x"}]}),
        ("Service", {"ports": [{"port": 1}]}),
    ):
        cluster.api.create(
            {
                "apiVersion": "v1",
                "kind": kind,
                "spec": spec,
                "metadata": {"name": "rb-worker-1", "namespace": ns},
            }
        )
    # Its shared volume: the claim made with the first workers, found again with the next.
    shared = {"storageClassName": "shared", "storage": "1Mi"}
    cluster.create(
        job("rb", replicas=2, maxReplicas=4, workerRestartPolicy="Always", cleanPodPolicy="All",
            sharedVolume=shared),
        ns,
    )  # fmt: skip
    wait_for(lambda: (cluster.condition(ns, "rb", "Blocked") or {}).get("status") == "True")
    # A second job finds its ConfigMap and launcher account, Role and binding taken (the
    # operator reads them to tell); a third names an SSH Secret of the user's (read, not
    # watched: it carries no label of ours).
    rbac_v1 = "rbac.authorization.k8s.io/v1"
    for api, kind, name in (
        ("v1", "ConfigMap", "rbx-config"),
        ("v1", "ServiceAccount", "rbx-launcher"),
        (rbac_v1, "Role", "rbx-launcher"),
        (rbac_v1, "RoleBinding", "rbx-launcher"),
    ):
        body: dict[str, object] = {"apiVersion": api, "kind": kind}
        body["metadata"] = {"name": name, "namespace": ns}
        if kind == "RoleBinding":
            body["roleRef"] = {"apiGroup": rbac_v1.split("/")[0], "kind": "Role", "name": name}
        cluster.api.create(body)
    cluster.create(job("rbx", replicas=1), ns)
    mine = {"arena.kubeflow.org/ssh-secret": "mine"}
    cluster.create(job("rbu", replicas=1, annotations=mine), ns)

    def blocked_by(name: str, needle: str) -> bool:
        return needle in str((cluster.condition(ns, name, "Blocked") or {}).get("message"))

    wait_for(partial(blocked_by, "rbx", "RoleBinding rbx-launcher exists"), 10)
    wait_for(partial(blocked_by, "rbu", "SSH Secret mine"), 10)
    cluster.api.delete("Pod", ns, "rb-worker-1")
    cluster.api.delete("Service", ns, "rb-worker-1")
    # The job's start (3 pods), then its ScaleOut's worker, on loaded nodes: 23 s of 30 once.
    wait_for(lambda: cluster.phase(ns, "first", "ScaleOut") == "ScaleSucceeded", 90, "first")
    # A launcher Role as an older operator made it (get only): brought up to date.
    wanted = cluster.obj("Role", ns, "rb-launcher")["rules"]
    cluster.api.patch("Role", ns, "rb-launcher", {"rules": [{**wanted[0], "verbs": ["get"]}]})
    wait_for(lambda: cluster.obj("Role", ns, "rb-launcher")["rules"] == wanted, 10, "Role rules")
    cluster.kubectl("scale", "tj", "rb", "-n", ns, "--replicas", "4")
    wait_for(lambda: len(cluster.hosts(ns, "rb")) == 4, 20, "4 workers")
    cluster.kubectl("scale", "tj", "rb", "-n", ns, "--replicas", "3")
    wait_for(lambda: len(cluster.hosts(ns, "rb")) == 3, 20, "3 workers")
    less = scalein("less", "rb", count=1)
    # An empty script (run as `sh <script>`: /bin/true was read as one and failed), run on the
    # launcher through pods/exec.
    less["spec"]["script"] = "/dev/null"
    cluster.create(less, ns)
    # A drain, then the script's exec: 20 s was too short once on a loaded machine (the
    # script's end came 18 s after the scale began).
    wait_for(lambda: cluster.phase(ns, "less", "ScaleIn") == "ScaleSucceeded", 60)
    ran = cluster.condition(ns, "less", "ScriptExecuted", "ScaleIn") or {}
    assert ran.get("status") == "True", ran
    # A ScaleOut Horovod never takes in (a stand-in Horovod process on the first host, the one
    # asked): the launcher's log is read for what it said of the new worker (pods/log).
    with horovod_process(cluster, ns, "rb", "rb-worker-0", "rb-worker-0"):
        cluster.create(scaleout("stalled", "rb", 1, timeout=30), ns)
        wait_for(
            lambda: "WaitingForHorovod"
            in str(cluster.condition(ns, "stalled", "Scaling", "ScaleOut")),
            30, "waiting for Horovod",
        )  # fmt: skip
        wait_for(lambda: cluster.phase(ns, "stalled", "ScaleOut") == "ScaleFailed", 40)
    cluster.finish(ns, "rb-worker-0", 1)
    wait_for(
        lambda: cluster.hosts(ns, "rb") == ["rb-worker-1", "rb-worker-5"],
        20,
        "worker-0 replaced by worker-5 (4 was the stalled ScaleOut's)",
    )
    cluster.finish(ns, "rb-launcher", 0)
    wait_for(lambda: cluster.pods(ns, "rb") == [], 20, "cleanup")
    queued_life(cluster, ns)
    gang = job("rbg", replicas=2, cleanPodPolicy="All")
    gang["spec"]["schedulingPolicy"] = {"minAvailable": 2}  # its Workload and PodGroup made
    cluster.create(gang, ns)
    wait_for(lambda: len(cluster.hosts(ns, "rbg")) == 2, 60, "the gang placed")

    wait_for(lambda: ("delete", "", "pods") in audited(cluster), 10, "the audit log")
    used = audited(cluster)
    missing = sorted(used - granted())
    assert not missing, f"the operator used permissions deploy/rbac.yaml does not grant: {missing}"
    unused = sorted(granted(("ClusterRole",)) - used)
    assert not unused, f"deploy/rbac.yaml grants permissions the operator never used: {unused}"


def test_deploy_renders_with_kustomize(cluster: Cluster) -> None:
    out = cluster.kubectl("kustomize", str(ROOT / "deploy")).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2  # a leader and a standby
    assert "--leader-election" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["resources"]["requests"]
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == sa
    # The CRDs applied are the generated ones, unchanged.
    from etoperator.api import crds

    rendered = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert rendered == {c["metadata"]["name"]: c for c in crds.all_crds().values()}


def test_pods_are_filtered_by_the_server(cluster: Cluster, ns: str) -> None:
    """Every pod list and watch of the operator carries our label selector, so the apiserver
    sends it only the pods of training jobs, never every pod of the cluster."""
    cluster.create(job("sel", replicas=1), ns)
    wait_for(lambda: cluster.phase(ns, "sel") == "Running", 30)
    reads = [
        str(ev["requestURI"])
        for ev in cluster.cp.audit()
        if (ev.get("user") or {}).get("username") == OPERATOR_USER
        and (ev.get("objectRef") or {}).get("resource") == "pods"
        and ev["verb"] in ("list", "watch")
    ]
    assert any("watch" in uri for uri in reads), reads
    unfiltered = [uri for uri in reads if "labelSelector=" not in uri]
    assert unfiltered == [], unfiltered


def queued_life(cluster: Cluster, ns: str) -> None:
    """A job Kueue admits: its priority class and flavor read, its Workloads made (the core,
    then the surplus), PodsReady written, a ScaleOut's slice made and removed at its timeout
    (no room), a ScaleIn giving quota back (the surplus's count patched), the end written
    (Finished)."""
    make_queue(cluster, ns, pods=4)
    wpc = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
           "metadata": {"name": f"p-{ns}"}, "value": 5}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(wpc))
    body = queued_job("rbq", replicas=3, maxReplicas=4)
    body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"p-{ns}"
    cluster.create(body, ns)
    wait_for(lambda: len(cluster.hosts(ns, "rbq")) == 3 and cluster.phase(ns, "rbq") == "Running",
             60, "rbq running")  # fmt: skip
    cluster.create(scaleout("rbq-o", "rbq", 1, timeout=3), ns)
    wait_for(lambda: cluster.phase(ns, "rbq-o", "ScaleOut") == "ScaleFailed", 20, "no room")
    cluster.create(scalein("rbq-i", "rbq", count=1), ns)
    wait_for(lambda: cluster.phase(ns, "rbq-i", "ScaleIn") == "ScaleSucceeded", 20)
    wait_for(lambda: [ps["count"] for w in live_workloads(cluster, ns, "rbq")
                      for ps in w["spec"]["podSets"] if ps["name"] == "worker"] == [1, 1],
             20, "the surplus asking for one worker")  # fmt: skip
    cluster.finish(ns, "rbq-launcher", 0)
    wait_for(lambda: live_workloads(cluster, ns, "rbq") == [], 20, "its Workload finished")
