"""A Torchrun job's pods: workers that each run torchrun's elastic agent with what only the
operator knows filled in (node counts, the rendezvous, the run's id, this node's address), and
the launcher that holds the rendezvous (etoperator/rendezvous.py, shipped in the ConfigMap).
Pure, as every builder."""

from __future__ import annotations

import os
import shlex
from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders import gang, pods
from etoperator.builders.common import ANYWHERE, Owner, Placement, init_like

KEEP_ALIVE = 1  # seconds between an agent's heartbeats (torch: 5)
# Heartbeats missed before a node counts as dead (torch: 3, so 15 s). A node that leaves on
# purpose is dropped at once (its leave hook); a killed one's peers fail their collective and
# wait the script's grace (the examples: 5 s) before their agents rejoin, by when it is swept.
# Fewer than 5 s swept live agents of starved nodes (two busy cores): torch stops a swept
# node's heartbeats without telling its agent, which runs on outside every round.
KEEP_ALIVE_MISSED = 5
CONNECT_WAIT = 300  # seconds a worker's first container waits for the rendezvous to listen
SCRIPT = f"{naming.CONFIG_MOUNT}/{naming.RENDEZVOUS_KEY}"
PYTHON = "$(command -v python3 || command -v python)"


def run_id(spec: JobSpec, run: int) -> str:
    """The rendezvous id: the job's uid and its run, so that no agent of an earlier run or
    another job ever meets this one's."""
    return f"{spec.uid or spec.name}-{run}"


def plain(spec: JobSpec) -> bool:
    """torchrun as it is: torch's own timeouts, no leave hook, a rendezvous that only stores."""
    return spec.annotations.get(naming.ANN_TORCHRUN_PLAIN, "").lower() == "true"


def endpoint(spec: JobSpec) -> str:
    assert spec.elastic is not None
    return f"{naming.launcher_name(spec.name)}:{spec.elastic.rdzv_port}"


def agent_env(spec: JobSpec, run: int) -> list[dict[str, Any]]:
    """torchrun reads each flag's default from PET_<FLAG>: the operator's, never the user's
    (models.OWNED_TORCHRUN_ENV are refused in the template)."""
    assert spec.elastic is not None
    most = spec.worker.max_replicas or spec.worker.limit
    conf = "is_host=false"
    if not plain(spec):
        conf += f",keep_alive_interval={KEEP_ALIVE},keep_alive_max_attempt={KEEP_ALIVE_MISSED}"
    values = {
        "PET_NNODES": f"{spec.worker.min_replicas}:{most}",
        "PET_NPROC_PER_NODE": str(spec.elastic.nproc_per_node),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": endpoint(spec),
        "PET_RDZV_ID": run_id(spec, run),
        "PET_RDZV_CONF": conf,
        "PET_MAX_RESTARTS": str(spec.elastic.max_restarts),
        # Off: a node that joins a later round waits forever for the address of a store that
        # the round's rank 0, holding one from an earlier round, never announces (torch 2.13;
        # pytorch/pytorch#135712 is the same sharing across restarts). Each round's rank 0
        # then starts the training's store afresh, as torchrun did before 2.4.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    env.append({"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return env


CONFIG_KEYS = (
    naming.RENDEZVOUS_KEY, naming.LEAVE_KEY, naming.AGENT_KEY, naming.DISCOVER_KEY,
    naming.HOSTFILE_KEY,
)  # fmt: skip


def save_request(spec: JobSpec) -> str | None:
    """The save handshake's request: the launcher touches it as the whole run stops (its
    preStop); none without a shared volume."""
    return None if spec.shared is None else f"{spec.shared.mount_path}/{naming.SAVE_REQUEST}"


def leave_hook(spec: JobSpec) -> dict[str, Any]:
    """A worker's preStop (leave.py): its node out of the rendezvous, its peers' training
    stopped first; in a whole stop, the save handshake's request and report to wait on."""
    argv = f"exec {PYTHON} {naming.CONFIG_MOUNT}/{naming.LEAVE_KEY}"
    request = save_request(spec)
    if request is not None:
        report = os.path.join(os.path.dirname(request), naming.SAVE_REPORT)
        argv += f" {shlex.quote(request)} {shlex.quote(report)}"
    return {"exec": {"command": ["sh", "-c", argv]}}


def _mounted(template: dict[str, Any], job: str) -> dict[str, Any]:
    """The template's pod spec with the job's ConfigMap mounted in the first container."""
    volume = pods.config_volume(job, CONFIG_KEYS)
    return pods.with_volumes(template, [volume], [pods.config_mount()])


def wait_for_rendezvous(spec: JobSpec, first: dict[str, Any]) -> dict[str, Any]:
    """An init container: the agent starts once the rendezvous listens under its name (a
    name cluster DNS may not know yet), so no agent spends its connect timeout on a launcher
    still starting."""
    assert spec.elastic is not None
    host, port = naming.launcher_name(spec.name), spec.elastic.rdzv_port
    code = (
        "import socket,sys,time\n"
        f"end=time.time()+{CONNECT_WAIT}\n"
        "while time.time()<end:\n"
        "    try:\n"
        f"        socket.create_connection(({host!r},{port}),2).close();sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.2)\n"
        "sys.exit(1)\n"
    )
    return init_like(
        first, "wait-for-rendezvous", ["sh", "-c", f"exec {PYTHON} -c {shlex.quote(code)}"]
    )


def forked_agent(container: dict[str, Any]) -> None:
    """A command that starts with torchrun runs it through our agent (torchagent.py):
    the same torchrun, its worker processes forked with torch imported (each membership
    change restarts them all). An image's own entrypoint is left as it is (not seen here)."""
    command = [str(a) for a in container.get("command") or []]
    if not command or os.path.basename(command[0]) != "torchrun":
        return
    run = f'exec {PYTHON} {naming.CONFIG_MOUNT}/{naming.AGENT_KEY} "$@"'
    container["command"] = ["sh", "-c", run, "torchrun", *command[1:]]  # then the args


def worker_pod(
    spec: JobSpec, owner: Owner, index: int, run: int, placement: Placement = ANYWHERE
) -> dict[str, Any]:
    name = naming.worker_name(spec.name, index)
    pod_spec = _mounted(spec.worker.template, spec.name)
    first = pod_spec["containers"][0]
    ours = agent_env(spec, run)
    names = {e["name"] for e in ours}
    first["env"] = [*(e for e in first.get("env") or [] if e.get("name") not in names), *ours]
    if not plain(spec):
        first.setdefault("lifecycle", {}).setdefault("preStop", leave_hook(spec))
        forked_agent(first)
    inits = [
        c for c in pod_spec.get("initContainers") or [] if c.get("name") != "wait-for-rendezvous"
    ]
    pod_spec["initContainers"] = [wait_for_rendezvous(spec, first), *inits]
    pod_spec.setdefault("hostname", name)
    placement.apply(pod_spec)
    gang.place(spec, pod_spec, worker=True)
    labels = naming.worker_labels(spec.name, index)
    return pods.pod_of(name, spec, owner, spec.worker.template, labels, pod_spec)


# Where the conductor reads whether its own pod is being deleted (a whole stop: rendezvous.py)
OWN_POD = {naming.LAUNCHER_POD_ENV: "metadata.name", naming.LAUNCHER_NS_ENV: "metadata.namespace"}


def launcher_pod(
    spec: JobSpec, owner: Owner, run: int, account: str, placement: Placement = ANYWHERE
) -> dict[str, Any]:
    """The rendezvous host of run `run`: torch's TCPStore and its conductor; it reads the
    host list as Horovod's launcher does (discover_hosts.sh, with `account`'s token:
    pods.launcher_service_account's answer)."""
    assert spec.elastic is not None
    pod_spec = _mounted(spec.launcher.template, spec.name)
    first = pod_spec["containers"][0]
    argv = [
        "serve", str(spec.elastic.rdzv_port), run_id(spec, run), str(spec.worker.min_replicas),
        "-" if plain(spec) else f"{naming.CONFIG_MOUNT}/{naming.DISCOVER_KEY}",
    ]  # fmt: skip
    request = save_request(spec)
    if request is not None and not plain(spec):
        argv.append(request)
    first["command"] = ["sh", "-c", f'exec {PYTHON} -u {SCRIPT} "$@"', "rendezvous", *argv]
    first.pop("args", None)
    first["env"] = [*(e for e in first.get("env") or [] if e.get("name") not in OWN_POD), *(
        {"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in OWN_POD.items()
    )]  # fmt: skip
    ports = [
        p for p in first.get("ports") or [] if p.get("containerPort") != spec.elastic.rdzv_port
    ]
    first["ports"] = [*ports, {"name": "rendezvous", "containerPort": spec.elastic.rdzv_port}]
    pod_spec["serviceAccountName"] = account  # the template's own, else the operator's
    pod_spec["automountServiceAccountToken"] = True
    placement.apply(pod_spec)
    gang.place(spec, pod_spec, worker=False)
    name, labels = naming.launcher_name(spec.name), naming.launcher_labels(spec.name)
    pod = pods.pod_of(name, spec, owner, spec.launcher.template, labels, pod_spec)
    pod["metadata"].setdefault("annotations", {})[naming.ANN_RUN] = str(run)
    return pod


def rendezvous_service(spec: JobSpec, owner: Owner) -> dict[str, Any]:
    """The launcher's name in cluster DNS, which every agent's endpoint names."""
    assert spec.elastic is not None
    name, labels = naming.launcher_name(spec.name), naming.launcher_labels(spec.name)
    return pods.headless_service(spec, owner, name, labels, {"rendezvous": spec.elastic.rdzv_port})
