"""A run of one worker under elastic horovodrun without --network-interface never trains:
Horovod waits for two hosts to find their common interfaces (seen here: a job of one worker
sat silent). Said as a Warning when such a run starts."""

from __future__ import annotations

from typing import Any

from etoperator.api.models import parse_job
from etoperator.planning import plan_job
from localcluster.manifests import job
from tests.unit.test_planning import inp

HOROVODRUN = [
    *("horovodrun", "-np", "1", "--min-np", "1", "--max-np", "4"),
    *("--host-discovery-script", "/etc/edl/discover_hosts.sh", "python3", "train.py"),
]


def warned(replicas: int, command: list[str]) -> bool:
    body: dict[str, Any] = job("j", replicas=replicas)
    body["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]["command"] = (
        command
    )
    body["metadata"].update(namespace="ns", uid="u")
    plan = plan_job(inp(parse_job(body), {}, []))
    return any(e.reason == "HorovodWaitsForTwoHosts" for e in plan.events)


def test_a_run_of_one_worker_without_a_network_interface_is_warned_of() -> None:
    assert warned(1, HOROVODRUN)
    assert warned(1, ["sh", "-c", " ".join(HOROVODRUN)])
    assert not warned(1, [*HOROVODRUN[:-2], "--network-interface", "eth0", *HOROVODRUN[-2:]])
    assert not warned(2, HOROVODRUN)
    assert not warned(1, ["python3", "train.py"])
