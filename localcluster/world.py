"""The local cluster's face for whoever drives one from Python (the tests, the benchmarks):
`World` reads and writes the world as a client would, in three shapes on the real control
plane: `Chain` (real nodes, the operator deployed from deploy/), `Hollow` (kubemark's hollow
nodes and the operator as a process: thousands of pods that run nothing), and the tests'
`Cluster` (tests/harness.py: real nodes, the operator direct or behind a fault proxy).
`wait_for` polls a condition with a deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from etoperator import kube, naming
from localcluster import runnotes
from localcluster.cluster import DeployedOperator, LocalCluster
from localcluster.controlplane import ControlPlane
from localcluster.hollow import HollowNodes
from localcluster.node import LogsRead
from localcluster.operatorproc import OperatorProcess

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(
    fn: Callable[[], T],
    timeout: float = 20.0,
    what: str = "condition",
    interval: float | None = None,
) -> T:
    """Poll `fn` until it returns something truthy; fail with the last value after `timeout`.
    Each poll is requests to an apiserver the suite's other processes share. By default a
    tenth of a second between them at first, then a tenth of the time waited so far (up to
    0.3 s): a wait past its first seconds waits on pods and processes, seconds each, and
    polled as often it was a sixth of the suite's requests. A test that times something
    finer passes its `interval`."""
    start = time.monotonic()
    deadline = start + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except (kube.ApiError, KeyError, IndexError, TypeError) as exc:
            last = exc
        else:
            if value:
                runnotes.slow_wait(what, time.monotonic() - start, timeout)
                return value
            last = value
        now = time.monotonic()
        if now > deadline:
            raise Timeout(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval if interval is not None else min(0.3, max(0.1, (now - start) / 10)))


def start_hollow(
    tmp: Path, nodes: int, max_pods: int, extra: list[str], kueue: bool = False
) -> Hollow:
    """The real control plane with kube-scheduler, hollow nodes (kubemark), Kueue if asked, and
    the operator as a real process under its deploy/ RBAC: thousands of pods that run nothing."""
    local = LocalCluster(
        tmp, hollow=nodes, max_pods=max_pods, operator_args=list(extra), kueue=kueue
    )
    return Hollow(**_started(local))


def start_real(tmp: Path, nodes: int = 2, kueue: bool = False) -> Real:
    """The real control plane, real nodes (containerd; workers with their sshd), Kueue if
    asked, and the operator as a process of this machine under its deploy/ RBAC."""
    return Real(**_started(LocalCluster(tmp, nodes=nodes, kueue=kueue)))


def _started(local: LocalCluster) -> dict[str, Any]:
    """The cluster started (stopped again if its start fails), with its operator process."""
    try:
        local.start()
    except BaseException:
        local.stop()
        raise
    assert local.cp is not None and local.operator is not None
    api = kube.Kube(kube.load_config(str(local.kubeconfig)))
    return {"local": local, "kubeconfig": local.kubeconfig, "api": api, "cp": local.cp,
            "operator": local.operator}  # fmt: skip


def start_chain(tmp: Path, nodes: int = 1) -> Chain:
    """The full chain: the real control plane, real nodes (containerd, kubelet, kube-proxy,
    kube-scheduler, CoreDNS) and the operator as deploy/ installs it. A plain cluster: no
    Kueue, no Workload API (what a job asking for either meets on most clusters)."""
    local = LocalCluster(tmp, nodes=nodes, deploy=True, workload_api=False)
    try:
        local.start()
    except BaseException:
        local.stop()
        raise
    assert local.deployed is not None
    api = kube.Kube(kube.load_config(str(local.kubeconfig)))
    return Chain(local, local.kubeconfig, api, local.deployed)


@dataclass
class World:
    local: LocalCluster
    kubeconfig: Path
    api: kube.Kube

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.local.run_kubectl(*args, input=input, check=check)

    def kubectl_create(self, ns: str, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """`kubectl create -f -` as a user would (validation on)."""
        return self.kubectl(
            "create",
            "-n",
            ns,
            "-f",
            "-",
            input=yaml.safe_dump(manifest),
            check=False,
        )

    def stop(self) -> None:
        self.local.stop()

    def new_namespace(self) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        self.local.create_namespace(name)
        return name

    def delete_namespace(self, name: str) -> None:
        self.local.delete_namespace(name)

    # -- reading the world ----------------------------------------------------------------

    def obj(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        """An object that must exist."""
        got = self.api.get(kind, ns, name)
        assert got is not None, f"{kind} {ns}/{name} is gone"
        return got

    def job(self, ns: str, name: str) -> dict[str, Any]:
        obj = self.api.get(naming.JOB_KIND, ns, name)
        assert obj is not None, f"job {ns}/{name} is gone"
        return obj

    def status(self, ns: str, name: str, kind: str = naming.JOB_KIND) -> dict[str, Any]:
        obj = self.api.get(kind, ns, name)
        return (obj or {}).get("status") or {}

    def phase(self, ns: str, name: str, kind: str = naming.JOB_KIND) -> str:
        return str(self.status(ns, name, kind).get("phase") or "")

    def describe(self, ns: str, job: str) -> str:
        """The job as a failed wait needs it told, in a few lines: its phase and conditions,
        its pods (phase, readiness, node, why not running), its host list, its latest events."""
        status = self.status(ns, job)
        lines = [f"job {job}: phase {status.get('phase')!r}"]
        for c in status.get("conditions") or []:
            lines.append(
                f"  {c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            )
        for p in self.api.list("Pod", ns, naming.selector({naming.LABEL_JOB: job})):
            st = p.get("status") or {}
            states: list[tuple[str, dict[str, Any]]] = [
                next(iter((cs.get("state") or {"?": {}}).items()))
                for cs in st.get("containerStatuses") or []
            ]
            why = ",".join(f"{k}:{v.get('reason', '')}" for k, v in states)
            gone = " deleting" if p["metadata"].get("deletionTimestamp") else ""
            lines.append(
                f"  pod {p['metadata']['name']}: {st.get('phase')}{gone} "
                f"node={p['spec'].get('nodeName')} ip={st.get('podIP')} [{why}]"
            )
        lines.append(f"  hosts: {self.hosts(ns, job)}")
        lines += self.telling_lines(ns, job)
        evs = sorted(self.api.list("Event", ns), key=lambda e: str(e.get("lastTimestamp") or ""))
        for e in evs[-8:]:
            who = e["involvedObject"].get("name")
            lines.append(f"  event {who} {e.get('type')} {e.get('reason')}: {e.get('message')}")
        return "\n".join(lines)

    TELLING = ("FAILED", "Error", "error", "leave:", "rendezvous closed", "the run stops", "RANK ")

    def telling_lines(self, ns: str, job: str) -> list[str]:
        """The lines of the job's pods that say why a run ended: torch's agents giving up or
        restarting for a failure, the leaves, the launcher's end (the last few of each)."""
        out = []
        for pod in self.pods(ns, job, live=False):
            lines = self.pod_log(ns, pod).splitlines()
            said = [x for x in lines if any(t in x for t in self.TELLING)]
            out += [f"  log {pod}: {x[:200]}" for x in said[-4:]]
        return out

    def pods(self, ns: str, job: str, role: str | None = None, live: bool = True) -> list[str]:
        labels = {naming.LABEL_JOB: job}
        if role:
            labels[naming.LABEL_ROLE] = role
        pods = self.api.list("Pod", ns, naming.selector(labels))
        if live:
            pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return sorted(p["metadata"]["name"] for p in pods)

    def pod_log(self, ns: str, name: str) -> str:
        """What the pod's container printed so far (real nodes: read from the node's files)."""
        return self.local.pod_log(ns, name)

    def stacks(self, ns: str, name: str) -> str:
        """Where each Python process of the pod stands, every thread (py-spy, from this
        machine): what a pod that hangs is waiting in, which its log does not say."""
        spy = Path(sys.executable).with_name("py-spy")
        said = []
        for pid in self.local.pod_pids(ns, name):
            try:
                if "python" not in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
                    continue
                out = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                                     text=True, timeout=30)  # fmt: skip
            except (OSError, subprocess.SubprocessError) as failed:
                said.append(f"pid {pid}: {failed}")
                continue
            said.append(out.stdout.strip() or f"pid {pid}: {out.stderr.strip()}")
        return "\n".join(said)

    def pod_log_since(self, ns: str, name: str, read: LogsRead) -> str:
        """What the pod printed since `read` was last given for it (a poller's read)."""
        return self.local.pod_log_since(ns, name, read)

    def exec(
        self, ns: str, pod: str, *argv: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl exec -i` into the pod's first container."""
        return self.kubectl("exec", "-i", "-n", ns, pod, "--", *argv, input=input, check=check)

    def kill(self, ns: str, name: str) -> None:
        """Every process of the pod's containers SIGKILLed: its node sees them die."""
        self.local.kill_pod(ns, name)

    def disrupt(self, ns: str, name: str) -> None:
        """A DisruptionTarget condition, as the control plane sets it before a preemption."""
        cond = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "preempted to make room for a pod of higher priority",
        }
        self.kubectl(
            "patch", "pod", name, "-n", ns, "--subresource=status", "--type=strategic",
            "-p", json.dumps({"status": {"conditions": [cond]}}),
        )  # fmt: skip

    def hosts(self, ns: str, job: str) -> list[str]:
        cm = self.api.get("ConfigMap", ns, naming.config_map_name(job))
        text = ((cm or {}).get("data") or {}).get(naming.HOSTFILE_KEY, "")
        return [line.rsplit(":", 1)[0] for line in text.splitlines() if line]

    def events(self, ns: str, name: str | None = None) -> list[dict[str, Any]]:
        evs = self.api.list("Event", ns)
        return [e for e in evs if name is None or e["involvedObject"].get("name") == name]

    def wait_event(
        self, ns: str, name: str, reason: str | None = None, etype: str | None = None
    ) -> dict[str, Any]:
        """The first Event about `name` of that reason (and type): the operator posts events
        just after the write they tell of, so a test that saw the write waits a moment."""
        found = wait_for(
            lambda: [
                e
                for e in self.events(ns, name)
                if reason in (None, e["reason"]) and etype in (None, e["type"])
            ],
            5,
            f"a {reason or etype} event about {name}",
        )
        return found[0]

    def condition(
        self, ns: str, name: str, ctype: str, kind: str = naming.JOB_KIND
    ) -> dict[str, Any] | None:
        for c in self.status(ns, name, kind).get("conditions") or []:
            if c.get("type") == ctype:
                return dict(c)
        return None

    # -- writing ----------------------------------------------------------------------------

    def create(self, manifest: dict[str, Any] | str, ns: str) -> dict[str, Any]:
        obj = yaml.safe_load(manifest) if isinstance(manifest, str) else manifest
        obj.setdefault("metadata", {})["namespace"] = ns
        return self.api.create(obj)


@dataclass
class Real(World):
    cp: ControlPlane
    operator: OperatorProcess


@dataclass
class Hollow(Real):
    def nodes(self) -> list[str]:
        return [HollowNodes.name(i) for i in range(self.local.hollow)]


@dataclass
class Chain(World):
    operator: DeployedOperator
