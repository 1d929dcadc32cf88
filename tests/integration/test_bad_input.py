"""The bad-input corpus: manifests a careless or hostile user might send, and the answer each
gets. The schema refuses what it can (kubectl says why); what only the operator can judge
becomes Failed/InvalidSpec, Blocked or ScaleFailed with a message naming the field. Through it
all a bystander job in the same namespace loses no worker and keeps being served."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from localcluster.manifests import job, scalein, scaleout
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.integration
Manifest = dict[str, Any]
W = "spec.etReplicaSpecs.worker"
L = "spec.etReplicaSpecs.launcher"
BYSTANDER = "bystander"


def at(path: str, value: Any) -> Callable[[Manifest], None]:
    """Set (or with ... delete) a dotted path; `[0]` picks a list item."""

    def mutate(m: Manifest) -> None:
        *parents, last = path.split(".")
        node: Any = m
        for part in parents:
            name, _, index = part.partition("[")
            node = node.setdefault(name, {})
            if index:
                node = node[int(index.rstrip("]"))]
        if value is ...:
            node.pop(last)
        else:
            node[last] = value

    return mutate


C0 = f"{W}.template.spec.containers[0]"
LC0 = f"{L}.template.spec.containers[0]"


def tj(*mutations: Callable[[Manifest], None], name: str = "bad") -> Manifest:
    m = job(name, replicas=1, maxReplicas=4)
    for mutate in mutations:
        mutate(m)
    return m


def so(**spec: Any) -> Manifest:
    m = scaleout("bad", BYSTANDER, 1)
    m["spec"].update(spec)
    return m


def si(**to_delete: Any) -> Manifest:
    m = scalein("bad", BYSTANDER, count=1)
    m["spec"]["toDelete"] = to_delete
    return m


# (manifest, what kubectl's error must contain)
SCHEMA: dict[str, tuple[Manifest, str]] = {
    "replicas 0": (tj(at(f"{W}.replicas", 0)), "greater than or equal to 1"),
    "replicas past the ceiling": (tj(at(f"{W}.replicas", 10_001)), "less than or equal to 10000"),
    "replicas a string": (tj(at(f"{W}.replicas", "two")), "replicas"),
    "minReplicas above replicas": (tj(at(f"{W}.minReplicas", 3)), "minReplicas must not exceed"),
    "replicas above maxReplicas": (tj(at(f"{W}.replicas", 5)), "must not exceed maxReplicas"),
    "maxReplicas 0": (tj(at(f"{W}.maxReplicas", 0)), "maxReplicas"),
    "slotsPerWorker 0": (tj(at("spec.slotsPerWorker", 0)), "slotsPerWorker"),
    "slotsPerWorker 2000": (tj(at("spec.slotsPerWorker", 2000)), "less than or equal to 1024"),
    "cleanPodPolicy unknown": (tj(at("spec.cleanPodPolicy", "Sometimes")), "cleanPodPolicy"),
    "restartPolicy unknown": (tj(at("spec.restartPolicy", "Maybe")), "restartPolicy"),
    "worker restartPolicy unknown": (tj(at(f"{W}.restartPolicy", "Later")), "restartPolicy"),
    "backoffLimit negative": (tj(at("spec.backoffLimit", -1)), "backoffLimit"),
    "attach mode unknown": (tj(at("spec.launcherAttachMode", "kubectl")), "launcherAttachMode"),
    "two launchers": (tj(at(f"{L}.replicas", 2)), "less than or equal to 1"),
    "no etReplicaSpecs": (tj(at("spec.etReplicaSpecs", ...)), "etReplicaSpecs"),
    "no worker": (tj(at("spec.etReplicaSpecs.worker", ...)), "worker"),
    "no launcher": (tj(at("spec.etReplicaSpecs.launcher", ...)), "launcher"),
    "no worker template": (tj(at(f"{W}.template", ...)), "template"),
    "template a string": (tj(at(f"{W}.template", "x")), "template"),
    "no containers": (tj(at(f"{W}.template.spec.containers", [])), "containers"),
    "containers a string": (tj(at(f"{W}.template.spec.containers", "x")), "containers"),
    "container without name": (tj(at(f"{C0}.name", ...)), "name"),
    "labels a string": (tj(at(f"{W}.template.metadata", {"labels": "abc"})), "labels"),
    "label value a number": (tj(at(f"{W}.template.metadata", {"labels": {"a": 1}})), "labels"),
    "annotations a list": (tj(at(f"{L}.template.metadata", {"annotations": ["a"]})), "annota"),
    "env a string": (tj(at(f"{C0}.env", "x")), "env"),
    "env item without name": (tj(at(f"{C0}.env", [{"value": "v"}])), "name"),
    "env value a number": (tj(at(f"{C0}.env", [{"name": "A", "value": 5}])), "value"),
    "volumeMounts a string": (tj(at(f"{C0}.volumeMounts", "x")), "volumeMounts"),
    "volumeMount without path": (tj(at(f"{C0}.volumeMounts", [{"name": "v"}])), "mountPath"),
    "resources a string": (tj(at(f"{C0}.resources", "lots")), "resources"),
    "command a string": (tj(at(f"{LC0}.command", "sh -c x")), "command"),
    "args numbers": (tj(at(f"{C0}.args", [1, 2])), "args"),
    "volumes a string": (tj(at(f"{W}.template.spec.volumes", "x")), "volumes"),
    "volume without name": (tj(at(f"{W}.template.spec.volumes", [{"emptyDir": {}}])), "name"),
    "initContainers a string": (tj(at(f"{W}.template.spec.initContainers", "x")), "initCont"),
    "ScaleOut count 0": (so(toAdd={"count": 0}), "greater than or equal to 1"),
    "ScaleOut count past the ceiling": (so(toAdd={"count": 10_001}), "less than or equal to"),
    "ScaleOut without toAdd": (scaleout("bad", BYSTANDER, 1) | {"spec": {"selector": {}}}, "toAdd"),
    "ScaleOut timeout 0": (so(timeout=0), "timeout"),
    "ScaleOut timeout past a day": (so(timeout=86_401), "less than or equal to 86400"),
    "ScaleOut env without name": (so(env=[{"value": "x"}]), "name"),
    "ScaleOut selector missing": (so(selector=None), "selector"),
    "ScaleOut selector name empty": (so(selector={"name": ""}), "name"),
    "ScaleOut selector name too long": (so(selector={"name": "a" * 64}), "name"),
    "ScaleOut selector name with a slash": (so(selector={"name": "x/y"}), "spec.selector.name"),
    "ScaleIn selector name in capitals": (
        scalein("bad", "Not_A_Job", count=1),
        "spec.selector.name",
    ),
    "ScaleIn count and podNames": (si(count=1, podNames=["x"]), "exactly one of"),
    "ScaleIn neither": (si(), "exactly one of"),
    "ScaleIn podNames empty": (si(podNames=[]), "podNames"),
    "ScaleIn count 0": (si(count=0), "greater than or equal to 1"),
    "ScaleIn podNames numbers": (si(podNames=[1]), "podNames"),
}

# Accepted by the schema, refused by the operator: (manifest, condition type, reason, needle)
OPERATOR: dict[str, tuple[Manifest, str, str, str]] = {
    "name with a leading digit": (tj(name="9lives"), "Failed", "InvalidSpec", "DNS-1035"),
    "replicas above the operator's limit": (
        tj(at(f"{W}.replicas", 1001), at(f"{W}.maxReplicas", 2000), name="huge"),
        "Failed", "InvalidSpec", "limit of 1000 workers per job",
    ),
    "minReplicas above the operator's limit": (
        tj(
            at(f"{W}.replicas", 1500), at(f"{W}.minReplicas", 1500), at(f"{W}.maxReplicas", 2000),
            name="hugemin",
        ),
        "Failed", "InvalidSpec", "replicas (1500) is above this operator's limit",
    ),
    "a negative GPU limit": (
        tj(at(f"{C0}.resources", {"limits": {"nvidia.com/gpu": "-5"}}), name="gpuneg"),
        "Failed", "InvalidSpec", "limits['nvidia.com/gpu']",
    ),
    "a fractional GPU limit": (
        tj(at(f"{C0}.resources", {"limits": {"nvidia.com/gpu": "1.5"}}), name="gpuhalf"),
        "Failed", "InvalidSpec", "whole number of GPUs",
    ),
    "too many GPUs": (
        tj(at(f"{C0}.resources", {"limits": {"nvidia.com/gpu": 5000}}), name="gpumany"),
        "Failed", "InvalidSpec", "from 0 to 1024",
    ),
    "a volume named like the key's": (
        tj(at(f"{W}.template.spec.volumes", [{"name": "etoperator-ssh", "emptyDir": {}}]),
           name="volssh"),
        "Failed", "InvalidSpec", "volumes[0].name 'etoperator-ssh' is reserved",
    ),
    "a sidecar mounting the key": (
        tj(
            at(f"{W}.template.spec.containers", [
                {"name": "worker", "image": "trainer:test"},
                {"name": "spy", "image": "x", "volumeMounts": [
                    {"name": "etoperator-ssh", "mountPath": "/keys"}]},
            ]),
            name="spy",
        ),
        "Failed", "InvalidSpec", "containers[1].volumeMounts[0].name 'etoperator-ssh'",
    ),
    "an init container mounting the host list": (
        tj(
            at(f"{L}.template.spec.initContainers", [{"name": "i", "image": "x", "volumeMounts": [
                {"name": "etoperator-config", "mountPath": "/c"}]}]),
            name="initcfg",
        ),
        "Failed", "InvalidSpec", "initContainers[0].volumeMounts[0]",
    ),
    "a mount over the key's path": (
        tj(at(f"{C0}.volumeMounts", [{"name": "mine", "mountPath": "/root/.ssh"}]),
           at(f"{W}.template.spec.volumes", [{"name": "mine", "emptyDir": {}}]), name="sshpath"),
        "Failed", "InvalidSpec", "mountPath /root/.ssh is where the operator mounts",
    ),
    "a mount over the host list's path": (
        tj(at(f"{LC0}.volumeMounts", [{"name": "mine", "mountPath": "/etc/edl/"}]),
           at(f"{L}.template.spec.volumes", [{"name": "mine", "emptyDir": {}}]), name="edlpath"),
        "Failed", "InvalidSpec", "mountPath /etc/edl/",
    ),
    "a mount over the key's path, spelled otherwise": (
        tj(at(f"{C0}.volumeMounts", [{"name": "mine", "mountPath": "/root/./.ssh"}]),
           at(f"{W}.template.spec.volumes", [{"name": "mine", "emptyDir": {}}]), name="sshdot"),
        "Failed", "InvalidSpec", "mountPath /root/./.ssh is where the operator mounts",
    ),
    "a launcher that runs as another user": (
        tj(at(f"{L}.template.spec.securityContext", {"runAsUser": 1000}), name="nonroot"),
        "Failed", "InvalidSpec", "runs as uid 1000",
    ),
    "an SSH Secret name that is no name": (
        tj(at("metadata.annotations", {"arena.kubeflow.org/ssh-secret": "Bad_Name"}),
           name="badsecret"),
        "Failed", "InvalidSpec", "names no valid Secret",
    ),
    "another job's SSH Secret": (
        tj(at("metadata.annotations", {"arena.kubeflow.org/ssh-secret": BYSTANDER}),
           name="thief"),
        "Blocked", "ChildConflict", f"belongs to TrainingJob {BYSTANDER}",
    ),
    "another job's SSH Secret mounted by the worker template": (
        tj(at(f"{W}.template.spec.volumes", [{"name": "stolen", "secret": {
            "secretName": BYSTANDER}}]), name="thief2"),
        "Blocked", "ChildConflict", f"TrainingJob {BYSTANDER}'s SSH key",
    ),
    "another job's SSH Secret in the launcher's environment": (
        tj(at(f"{LC0}.env", [{"name": "K", "valueFrom": {"secretKeyRef": {
            "name": BYSTANDER, "key": "id_rsa"}}}]), name="thief3"),
        "Blocked", "ChildConflict", "containers[0].env[0] names Secret",
    ),
    "a missing SSH Secret": (
        tj(at("metadata.annotations", {"arena.kubeflow.org/ssh-secret": "nowhere"}),
           name="nokey"),
        "Blocked", "ChildConflict", "SSH Secret nowhere named by the annotation is missing",
    ),
    "a ScaleOut past maxReplicas": (
        scaleout("past-max", BYSTANDER, 3), "ScaleFailed", "MaxReplicasExceeded", "maxReplicas 4",
    ),
    "a ScaleOut past the operator's limit": (
        scaleout("past-limit", "roomy", 2000),
        "ScaleFailed", "MaxReplicasExceeded", "this operator's limit of workers per job 1000",
    ),
    "a ScaleIn of pods that are not workers": (
        scalein("strangers", BYSTANDER, pod_names=[f"{BYSTANDER}-launcher", "kube-dns"]),
        "ScaleFailed", "InvalidScaleIn", "not current workers of job",
    ),
    "a ScaleIn below minReplicas": (
        scalein("too-few", BYSTANDER, count=2), "ScaleFailed", "InvalidScaleIn", "below minReplic",
    ),
    "a ScaleIn of another job's worker": (
        scalein("poach", "roomy", pod_names=[f"{BYSTANDER}-worker-0"]),
        "ScaleFailed", "InvalidScaleIn", f"{BYSTANDER}-worker-0",
    ),
    "a relative script path": (
        scaleout("relscript", BYSTANDER, 1) | {"spec": {
            "selector": {"name": BYSTANDER}, "toAdd": {"count": 1}, "script": "x.sh"}},
        "ScaleFailed", "InvalidSpec", "absolute path",
    ),
    "a variable name with a digit first": (
        scaleout("envdigit", BYSTANDER, 1) | {"spec": {
            "selector": {"name": BYSTANDER}, "toAdd": {"count": 1},
            "env": [{"name": "1BAD", "value": "x"}]}},
        "ScaleFailed", "InvalidSpec", "spec.env[0].name '1BAD'",
    ),
    "a variable name with '='": (
        scaleout("envequals", BYSTANDER, 1) | {"spec": {
            "selector": {"name": BYSTANDER}, "toAdd": {"count": 1},
            "env": [{"name": "A=B", "value": "x"}]}},
        "ScaleFailed", "InvalidSpec", "not a valid variable name",
    ),
    "a variable too long for one argument": (
        scaleout("envbig", BYSTANDER, 1) | {"spec": {
            "selector": {"name": BYSTANDER}, "toAdd": {"count": 1}, "script": "/bin/true",
            "env": [{"name": "BIG", "value": "x" * 200_000}]}},
        "ScaleFailed", "InvalidSpec", "Linux takes at most 131071 bytes",
    ),
    "a pod name that is no name": (
        scalein("upper", BYSTANDER, pod_names=["UPPER;rm -rf /"]),
        "ScaleFailed", "InvalidSpec", "invalid pod name",
    ),
    "a pod named twice": (
        scalein("twice", BYSTANDER, pod_names=[f"{BYSTANDER}-worker-0"] * 2),
        "ScaleFailed", "InvalidSpec", "lists a pod twice",
    ),
}  # fmt: skip


def test_the_corpus_is_big_enough() -> None:
    assert len(SCHEMA) + len(OPERATOR) >= 60


@pytest.fixture(scope="module")
def world(cluster: Cluster) -> Iterator[tuple[str, dict[str, str]]]:
    """A namespace with the bystander (2 workers, running) and a job with room to grow."""
    from tests.support.waits import running

    ns = cluster.new_namespace()
    cluster.create(job(BYSTANDER, replicas=2, minReplicas=1, maxReplicas=4), ns)
    cluster.create(job("roomy", replicas=1, maxReplicas=3000), ns)
    running(cluster, ns, BYSTANDER)
    running(cluster, ns, "roomy", 1)
    yield ns, uids(cluster, ns)
    cluster.delete_namespace(ns)


def uids(cluster: Cluster, ns: str, job: str = BYSTANDER) -> dict[str, str]:
    pods = cluster.api.list("Pod", ns, f"training-job-name={job}")
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


@pytest.mark.parametrize("case", list(SCHEMA))
def test_the_schema_refuses(cluster: Cluster, world: tuple[str, dict[str, str]], case: str) -> None:
    ns, _ = world
    manifest, needle = SCHEMA[case]
    res = cluster.kubectl_create(ns, manifest)
    assert res.returncode != 0 and needle in res.stderr, res.stderr
    assert cluster.api.get(manifest["kind"], ns, manifest["metadata"]["name"]) is None


@pytest.mark.parametrize("case", list(OPERATOR))
def test_the_operator_answers(
    cluster: Cluster, world: tuple[str, dict[str, str]], case: str
) -> None:
    ns, bystander = world
    manifest, ctype, reason, needle = OPERATOR[case]
    res = cluster.kubectl_create(ns, manifest)
    assert res.returncode == 0, res.stderr
    kind, name = manifest["kind"], manifest["metadata"]["name"]

    def raised() -> dict[str, Any]:
        cond = cluster.condition(ns, name, ctype, kind) or {}
        return cond if cond.get("status") == "True" else {}

    cond = wait_for(raised, 15, f"{kind} {name} {ctype}")
    assert cond["reason"] == reason and needle in cond["message"], cond
    event = cluster.wait_event(ns, name, reason)
    assert event["type"] == "Warning"
    if kind == "TrainingJob":
        assert cluster.pods(ns, name) == []  # refused before any child is built
    assert uids(cluster, ns) == bystander  # no innocent worker lost


def test_the_bystander_is_still_served(cluster: Cluster, world: tuple[str, dict[str, str]]) -> None:
    ns, bystander = world
    assert uids(cluster, ns) == bystander
    cluster.create(scaleout("after-all", BYSTANDER, 1), ns)
    wait_for(lambda: cluster.phase(ns, "after-all", "ScaleOut") == "ScaleSucceeded", 20)
    assert len(cluster.hosts(ns, BYSTANDER)) == 3


def test_an_invalid_edit_of_a_running_job_is_refused_and_it_runs_on(
    cluster: Cluster, ns: str
) -> None:
    """`kubectl edit` of a running job into a spec only the operator refuses (a reserved
    volume name) made the job Failed while its pods ran on; fixing the spec then started a
    new run. The edit is refused (Blocked, a Warning), the job runs and scales on as it was,
    and once the spec is fixed nothing is restarted."""
    from tests.support.waits import running

    cluster.create(job("edited", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "edited")
    before = uids(cluster, ns, "edited")

    def volumes(value: Any) -> str:
        template = {"template": {"spec": {"volumes": value}}}
        return json.dumps({"spec": {"etReplicaSpecs": {"worker": template}}})

    def patch(body: str) -> None:
        res = cluster.kubectl("patch", "tj", "edited", "-n", ns, "--type=merge", "-p", body)
        assert res.returncode == 0, res.stderr

    spec = cluster.job(ns, "edited")["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
    theirs = spec.get("volumes") or []
    patch(volumes([*theirs, {"name": "etoperator-ssh", "emptyDir": {}}]))  # the schema lets it in

    def blocked() -> dict[str, Any]:
        cond = cluster.condition(ns, "edited", "Blocked") or {}
        return cond if cond.get("status") == "True" else {}

    cond = wait_for(blocked, 20, "the edit refused")
    assert cond["reason"] == "InvalidSpec" and "etoperator-ssh" in cond["message"], cond
    assert cluster.wait_event(ns, "edited", "InvalidSpec")["type"] == "Warning"
    assert cluster.phase(ns, "edited") == "Running"
    patch(volumes(theirs))
    wait_for(lambda: (cluster.condition(ns, "edited", "Blocked") or {}).get("status") == "False",
             20, "the fix seen")  # fmt: skip
    assert uids(cluster, ns, "edited") == before  # nothing restarted
    assert cluster.phase(ns, "edited") == "Running"
    cluster.create(scaleout("after-fix", "edited", 1), ns)
    wait_for(lambda: cluster.phase(ns, "after-fix", "ScaleOut") == "ScaleSucceeded", 30)
