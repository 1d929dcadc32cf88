"""Manifests used by the integration tests."""

from __future__ import annotations

import copy
from typing import Any

from etoperator.naming import API_VERSION


def job(name: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    worker: dict[str, Any] = {
        "replicas": replicas,
        "template": {"spec": {"containers": [{"name": "worker", "image": "trainer:test"}]}},
    }
    for key in ("minReplicas", "maxReplicas"):
        if key in spec:
            worker[key] = spec.pop(key)
    if "workerRestartPolicy" in spec:
        worker["restartPolicy"] = spec.pop("workerRestartPolicy")
    launcher: dict[str, Any] = {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "launcher",
                        "image": "trainer:test",
                        "command": [
                            "sh",
                            "-c",
                            "horovodrun -np 2 --host-discovery-script "
                            "/etc/edl/discover_hosts.sh python train.py",
                        ],
                    }
                ]
            }
        }
    }
    if "launcherRestartPolicy" in spec:
        launcher["restartPolicy"] = spec.pop("launcherRestartPolicy")
    annotations = spec.pop("annotations", None)
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"etReplicaSpecs": {"launcher": launcher, "worker": worker}, **spec},
    }
    if annotations:
        body["metadata"]["annotations"] = annotations
    return copy.deepcopy(body)


def _scaler(kind: str, name: str, spec: dict[str, Any], timeout: int | None) -> dict[str, Any]:
    if timeout is not None:
        spec["timeout"] = timeout
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


def scaleout(name: str, job_name: str, count: int, timeout: int | None = None) -> dict[str, Any]:
    return _scaler(
        "ScaleOut", name, {"selector": {"name": job_name}, "toAdd": {"count": count}}, timeout
    )


def scalein(
    name: str,
    job_name: str,
    count: int | None = None,
    pod_names: list[str] | None = None,
    timeout: int | None = None,
) -> dict[str, Any]:
    to_delete: dict[str, Any] = {}
    if count is not None:
        to_delete["count"] = count
    if pod_names is not None:
        to_delete["podNames"] = pod_names
    return _scaler(
        "ScaleIn", name, {"selector": {"name": job_name}, "toDelete": to_delete}, timeout
    )
