"""Kueue on the local cluster, as tests set it up: a queue per test namespace, jobs whose pods
ask for CPU (quota counts requests), and the Workloads read back."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client as k8s
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from etoperator import kube, naming
from localcluster.manifests import job
from localcluster.world import World

MILLICPU = 100  # each pod's request, unless a test says otherwise
KUEUE = "kueue.x-k8s.io/v1beta2"
SLICE_NAME = "kueue.x-k8s.io/workload-slice-name"  # a Workload family's name, as Kueue reads it


def queued_job(
    name: str, queue: str = "lq", replicas: int = 2, millicpu: int = MILLICPU, **spec: Any
) -> dict[str, Any]:
    body = job(name, replicas=replicas, **spec)
    body["metadata"]["labels"] = {naming.LABEL_QUEUE: queue}
    for role in ("launcher", "worker"):
        pod = body["spec"]["etReplicaSpecs"][role]["template"]["spec"]
        pod["containers"][0]["resources"] = {"requests": {"cpu": f"{millicpu}m"}}
    return body


def make_queue(
    cluster: World,
    ns: str,
    pods: int,
    preempt: bool = False,
    labels: dict[str, str] | None = None,
    millicpu: int = MILLICPU,
) -> str:
    """A flavor, a ClusterQueue with room for `pods` pods of this namespace, and LocalQueue
    `lq`; returns the ClusterQueue's name."""
    cq = f"cq-{ns}"
    flavor: dict[str, Any] = {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                              "metadata": {"name": f"f-{ns}"}}  # fmt: skip
    if labels:
        flavor["spec"] = {"nodeLabels": labels}
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [
                    {
                        "name": f"f-{ns}",
                        "resources": [{"name": "cpu", "nominalQuota": f"{pods * millicpu}m"}],
                    }
                ],
            }
        ],
    }
    if preempt:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    docs = [
        flavor,
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": cq}, "spec": spec},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
         "spec": {"clusterQueue": cq}},
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return cq


def workloads(cluster: World, ns: str) -> list[dict[str, Any]]:
    return cluster.api.list(naming.WORKLOAD_KIND, ns)


def live_workloads(cluster: World, ns: str, job_name: str) -> list[dict[str, Any]]:
    """The job's Workloads not finished."""
    return [
        w
        for w in workloads(cluster, ns)
        if (w["metadata"].get("labels") or {}).get(naming.LABEL_JOB) == job_name and not finished(w)
    ]


def admitted_workers(cluster: World, ns: str, job_name: str) -> int:
    """The workers Kueue admits the job now: its core's and its surplus's (each family's
    largest admission: a slice and what it replaces may both show one for a moment)."""
    families: dict[str, int] = {}
    for w in live_workloads(cluster, ns, job_name):
        family = (w["metadata"].get("annotations") or {}).get(SLICE_NAME, "")
        for psa in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
            if psa["name"] == "worker":
                families[family] = max(families.get(family, 0), int(psa.get("count") or 0))
    return sum(families.values())


def core_workloads(cluster: World, ns: str, job_name: str) -> list[dict[str, Any]]:
    """The job's live Workloads but its surplus (the launcher's and minReplicas workers')."""
    return [w for w in live_workloads(cluster, ns, job_name) if not is_surplus(w)]


def is_surplus(w: dict[str, Any]) -> bool:
    """Of the job's surplus family (its slice name ends so: docs/kueue.md)."""
    return str((w["metadata"].get("annotations") or {}).get(SLICE_NAME, "")).endswith("-surplus")


def surplus_workloads(cluster: World, ns: str, job_name: str) -> list[dict[str, Any]]:
    return [w for w in live_workloads(cluster, ns, job_name) if is_surplus(w)]


def millicpu(quantity: object) -> int:
    """A CPU quantity ("50m", "1", "0.5") in millicores."""
    text = str(quantity or "0")
    return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)


def reserved(cluster: World, cq: str) -> int:
    """What the ClusterQueue reserves now, in millicores (its status, as Kueue counts it)."""
    body = k8s.CustomObjectsApi(cluster.api.api).get_cluster_custom_object(
        naming.KUEUE_GROUP, naming.KUEUE_VERSION, "clusterqueues", cq
    )
    total = 0
    for flavor in (body.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            if res.get("name") == "cpu":
                total += millicpu(res.get("total"))
    return total


def admitted(live: list[dict[str, Any]], cq: str) -> int:
    """What the Workloads Kueue admitted to `cq` and not finished hold, in millicores: the
    admission each carries, written as Kueue reserves it (the ClusterQueue's status totals it
    a moment later, seen over a second later on a loaded machine)."""
    total = 0
    for w in live:
        admission = (w.get("status") or {}).get("admission") or {}
        if admission.get("clusterQueue") != cq or finished(w):
            continue
        for podset in admission.get("podSetAssignments") or []:
            total += millicpu((podset.get("resourceUsage") or {}).get("cpu"))
    return total


def pods_request(pods: list[dict[str, Any]]) -> int:
    """What the jobs' pods that hold their nodes' resources ask for: all but those ended (one
    being deleted runs until it is gone, a deleted job's too: its Workloads stay until then)."""
    total = 0
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod["spec"]["containers"]:
            total += millicpu(((c.get("resources") or {}).get("requests") or {}).get("cpu"))
    return total


@dataclass
class QuotaWatch:
    """Samples, every `every` seconds while a test runs, what Kueue's users count on: the
    requests of the namespace's job pods never exceed what its ClusterQueue reserves, and no
    worker runs for a job none of whose unfinished Workloads holds a reservation. Kueue writes
    the ClusterQueue's status a moment after it admits, so a breach counts once it lasts
    `lasting` seconds (the defects this guards against lasted tens of seconds); the
    reservation is the largest of the ClusterQueue's before and after the pods and what the
    admissions of the Workloads read after them hold."""

    cluster: World
    ns: str
    cq: str
    # Each sample is four requests: at 0.2 s they were a quarter of the apiserver's CPU in a
    # queued test (15.7 -> 11.6 CPU-s at 0.5); a breach still needs three samples in a row.
    every: float = 0.5
    lasting: float = 1.0
    samples: int = 0
    breaches: list[str] = field(default_factory=list)
    _since: dict[str, float] = field(default_factory=dict)
    _began: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> QuotaWatch:
        self._thread = threading.Thread(target=self._run, name="quota-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)
        if exc[0] is None:
            self.check()

    def check(self) -> None:
        assert self.samples > 0, "the quota was never sampled"
        assert not self.breaches, f"{len(self.breaches)} breaches; first: {self.breaches[0]}"

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                found = self.sample()
            except (kube.ApiError, ApiException, OSError, urllib3.exceptions.HTTPError):
                continue  # an apiserver a test restarts: the next sample
            self.samples += 1
            now = time.monotonic()
            for key in [k for k in self._since if k not in found]:
                del self._since[key]
            for key, what in found.items():
                start = self._since.setdefault(key, now)
                if now - start >= self.lasting and len(self.breaches) < 50:
                    at = start - self._began  # which of a test's steps, told by its log
                    self.breaches.append(f"{what} (for {now - start:.1f}s, {at:.1f}s in)")

    def sample(self) -> dict[str, str]:
        """The breaches seen now, by what they are about."""
        before = reserved(self.cluster, self.cq)
        pods = [
            p
            for p in self.cluster.api.list("Pod", self.ns)
            if (p["metadata"].get("labels") or {}).get(naming.LABEL_GROUP) == naming.GROUP
        ]
        live = workloads(self.cluster, self.ns)
        ceiling = max(before, reserved(self.cluster, self.cq), admitted(live, self.cq))
        found = {}
        asked = pods_request(pods)
        if asked > ceiling:
            names = sorted(p["metadata"]["name"] for p in pods)
            found["quota"] = f"pods ask {asked}m, {self.cq} reserves {ceiling}m: {names}"
        holding = {
            (w["metadata"].get("labels") or {}).get(naming.LABEL_JOB)
            for w in live
            if (w.get("status") or {}).get("admission") and not finished(w)
        }
        for p in pods:
            labels = p["metadata"].get("labels") or {}
            job = labels.get(naming.LABEL_JOB)
            running = (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            if labels.get(naming.LABEL_ROLE) == "worker" and running and job not in holding:
                found[f"job {job}"] = f"{p['metadata']['name']} runs, job {job} holds no admission"
        return found


def finished(w: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Finished" and c["status"] == "True"
        for c in (w.get("status") or {}).get("conditions") or []
    )
