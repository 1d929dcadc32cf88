"""The three CRDs, as code: the one source of `crds/*.yaml` (`python -m etoperator.api.crds`).

A test regenerates them and fails on drift. Pod templates keep unknown fields (they are full
PodTemplateSpecs, and their metadata must survive pruning); everything the operator reads is
typed, bounded and defaulted so the API server rejects bad input before the operator sees it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from etoperator import naming
from etoperator.api import fields as f
from etoperator.api.scalerschema import scalein_schema, scaleout_schema
from etoperator.api.statuses import JobStatus

Schema = dict[str, Any]


def _int(
    minimum: int | None = None,
    default: int | None = None,
    desc: str = "",
    maximum: int | None = None,
) -> Schema:
    s: Schema = {"type": "integer", "format": "int32"}
    if minimum is not None:
        s["minimum"] = minimum
    if maximum is not None:
        s["maximum"] = maximum
    if default is not None:
        s["default"] = default
    if desc:
        s["description"] = desc
    return s


def _objects(required: list[str], properties: dict[str, Schema] | None = None) -> Schema:
    item: Schema = {
        "type": "object",
        "required": required,
        "x-kubernetes-preserve-unknown-fields": True,
    }
    item["properties"] = {k: {"type": "string"} for k in required} | (properties or {})
    return {"type": "array", "items": item}


_STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
_OPEN: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
# The parts of a container the operator reads or adds to; the rest is the kubelet's business.
_CONTAINER: Schema = _objects(
    ["name"],
    {
        "image": {"type": "string"},
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "env": _objects(["name"], {"value": {"type": "string"}}),
        "volumeMounts": _objects(["name", "mountPath"]),
        "resources": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"limits": _OPEN, "requests": _OPEN},
        },
    },
)


def _pod_template(desc: str) -> Schema:
    return {
        "type": "object",
        "description": desc,
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "metadata": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"labels": _STRING_MAP, "annotations": _STRING_MAP},
            },
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "required": ["containers"],
                "properties": {
                    "containers": {**_CONTAINER, "minItems": 1},
                    "initContainers": _CONTAINER,
                    "volumes": _objects(["name"]),
                },
            },
        },
    }


def _cel(*rules: tuple[str, str]) -> list[Schema]:
    """x-kubernetes-validations: (rule, message) each."""
    return [{"rule": rule, "message": message} for rule, message in rules]


_WORKER_CEL = _cel(
    ("!has(self.minReplicas) || self.minReplicas <= self.replicas",
     "minReplicas must not exceed replicas"),
    ("!has(self.maxReplicas) || self.replicas <= self.maxReplicas",
     "replicas must not exceed maxReplicas"),
)  # fmt: skip


def trainingjob_schema() -> Schema:
    spec: Schema = {
        "type": "object",
        "required": ["etReplicaSpecs"],
        "properties": {
            "etReplicaSpecs": _replica_specs(),
            "runtime": f.RUNTIME.schema(),
            **_runtime_parts(),
            "slotsPerWorker": f.SLOTS.schema(),
            "cleanPodPolicy": f.CLEAN_POD.schema(),
            "restartPolicy": f.JOB_RESTART.schema(),
            "backoffLimit": f.BACKOFF.schema(),
            "launcherAttachMode": f.ATTACH.schema(),
            "schedulingPolicy": _scheduling(),
            "suspend": {
                "type": "boolean",
                "description": "true: no pods (all deleted); false again: a fresh run. A job "
                "queued by Kueue is started by its admission, not by this field.",
            },
        },
        "x-kubernetes-validations": _JOB_CEL,
    }
    return {"type": "object", "properties": {"spec": spec, "status": JobStatus.schema()}}


_JOB_CEL = _cel(
    ("has(self.etReplicaSpecs.launcher) || self.runtime == 'Torchrun'",
     "etReplicaSpecs.launcher is required unless runtime is Torchrun"),
    ("!has(self.elasticPolicy) || self.runtime == 'Torchrun'",
     "elasticPolicy is for runtime Torchrun"),
)  # fmt: skip


def _replica_specs() -> Schema:
    worker: Schema = {
        "type": "object",
        "required": ["template"],
        "x-kubernetes-validations": _WORKER_CEL,
        "properties": {
            "replicas": f.REPLICAS.schema(),
            "minReplicas": f.MIN_REPLICAS.schema(),
            "maxReplicas": f.MAX_REPLICAS.schema(),
            "restartPolicy": f.WORKER_RESTART.schema(with_default=False),
            "template": _pod_template("PodTemplateSpec of a worker"),
        },
    }
    launcher: Schema = {
        "type": "object",
        "required": ["template"],
        "properties": {
            "replicas": f.LAUNCHER_REPLICAS.schema(),
            "restartPolicy": f.LAUNCHER_RESTART.schema(with_default=False),
            "template": _pod_template("PodTemplateSpec of the launcher"),
        },
    }
    return {
        "type": "object",
        "required": ["worker"],
        "properties": {"launcher": launcher, "worker": worker},
    }


def _runtime_parts() -> dict[str, Schema]:
    """The shared volume and a Torchrun job's agents."""
    return {
        "sharedVolume": {
            "type": "object",
            "description": "A ReadWriteMany claim the operator makes for the job (its "
            "checkpoints), mounted in every worker at mountPath (CHECKPOINT_DIR in their "
            "environment); deleted with the job, kept across its runs.",
            "properties": {
                "mountPath": {"type": "string", "default": "/checkpoints"},
                "storageClassName": {"type": "string", "maxLength": 253},
                "storage": {"type": "string", "default": "1Gi", "description": "its size"},
            },
        },
        "elasticPolicy": {
            "type": "object",
            "description": "A Torchrun job's agents (PyTorchJob's elasticPolicy; the node "
            "counts are the worker's minReplicas and maxReplicas).",
            "properties": {
                "nProcPerNode": f.NPROC.schema(),
                "maxRestarts": f.MAX_RESTARTS.schema(),
                "rdzvPort": f.RDZV_PORT.schema(),
            },
        },
    }


def _scheduling() -> Schema:
    name: Schema = {"type": "string", "maxLength": 253}
    return {
        "type": "object",
        "description": "Gang scheduling through Kubernetes' Workload API "
        "(scheduling.k8s.io/v1alpha2): the workers are placed all or nothing.",
        "properties": {
            "minAvailable": f.MIN_AVAILABLE.schema(),
            "priorityClass": {**name, "description": "the pods' PriorityClass"},
            "schedulerName": {**name, "description": "the scheduler that places the pods"},
        },
    }


def _crd(
    kind: str,
    plural: str,
    short: str,
    schema: Schema,
    columns: list[dict[str, Any]],
    scale: dict[str, str] | None = None,
) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = scale
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{naming.GROUP}"},
        "spec": {
            "group": naming.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["etoperator"],
            },
            "versions": [
                {
                    "name": naming.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": [
                        *columns,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


_PHASE: dict[str, Any] = {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}


def _scaler_columns(count: str, pods: str) -> list[dict[str, Any]]:
    """What a user wants from `kubectl get so,si`: which job, how many, which pods, and why a
    scale failed."""
    return [
        _PHASE,
        {"name": "Job", "type": "string", "jsonPath": ".spec.selector.name"},
        {"name": "Count", "type": "integer", "jsonPath": count},
        {"name": "Pods", "type": "string", "jsonPath": pods},
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="ScaleFailed")].message',
            "priority": 1,
        },
    ]


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD manifest."""
    return {
        "trainingjobs.yaml": _crd(
            naming.JOB_KIND,
            naming.JOB_PLURAL,
            "tj",
            trainingjob_schema(),
            [
                _PHASE,
                {"name": "Workers", "type": "integer", "jsonPath": ".status.replicas"},
                {
                    "name": "Target",
                    "type": "integer",
                    "jsonPath": ".spec.etReplicaSpecs.worker.replicas",
                },
                {
                    "name": "Restarts",
                    "type": "integer",
                    "jsonPath": ".status.restartCount",
                    "priority": 1,
                },
            ],
            scale={
                "specReplicasPath": ".spec.etReplicaSpecs.worker.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.workerSelector",
            },
        ),
        "scaleouts.yaml": _crd(
            naming.SCALEOUT_KIND,
            naming.SCALEOUT_PLURAL,
            "so",
            scaleout_schema(),
            _scaler_columns(".spec.toAdd.count", ".status.addPods"),
        ),
        "scaleins.yaml": _crd(
            naming.SCALEIN_KIND,
            naming.SCALEIN_PLURAL,
            "si",
            scalein_schema(),
            _scaler_columns(".spec.toDelete.count", ".status.toDeletePods"),
        ),
    }


class _NoAliases(yaml.SafeDumper):
    """Shared schema pieces are written out in full: no YAML anchors in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(crd: dict[str, Any]) -> str:
    header = (
        "# Generated by `python -m etoperator.api.crds`; edit etoperator/api/crds.py instead.\n"
    )
    return header + yaml.dump(crd, Dumper=_NoAliases, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0] if argv else "crds")
    out.mkdir(parents=True, exist_ok=True)
    for fname, crd in all_crds().items():
        (out / fname).write_text(render(crd))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
