"""The ScaleOut and ScaleIn schemas (crds.py makes their CRDs)."""

from __future__ import annotations

from typing import Any

from etoperator import naming
from etoperator.api import fields as f
from etoperator.api.statuses import ScaleInStatus, ScaleOutStatus

Schema = dict[str, Any]


def _scaler_spec(extra: dict[str, Schema], required: list[str]) -> Schema:
    return {
        "type": "object",
        "required": ["selector", *required],
        "properties": {
            "selector": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 63,
                        "pattern": naming.DNS1123_LABEL_PATTERN,
                        "description": "the TrainingJob's name (a DNS-1123 label)",
                    }
                },
            },
            "timeout": f.TIMEOUT.schema(),
            "script": {
                "type": "string",
                "description": "absolute path of a script in the launcher",
            },
            "env": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
                },
            },
            "backoffLimit": f.SCALER_BACKOFF.schema(),
            **extra,
        },
    }


def scaleout_schema() -> Schema:
    spec = _scaler_spec(
        {
            "toAdd": {
                "type": "object",
                "required": ["count"],
                "properties": {"count": f.ADD_COUNT.schema()},
            }
        },
        ["toAdd"],
    )
    return {
        "type": "object",
        "properties": {"spec": spec, "status": ScaleOutStatus.schema()},
    }


def scalein_schema() -> Schema:
    spec = _scaler_spec(
        {
            "toDelete": {
                "type": "object",
                "x-kubernetes-validations": [
                    {
                        "rule": "has(self.count) != has(self.podNames)",
                        "message": "give exactly one of count and podNames",
                    }
                ],
                "properties": {
                    "count": f.DELETE_COUNT.schema(),
                    "podNames": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": f.MAX_WORKERS,
                        "items": {"type": "string", "maxLength": 253},
                    },
                },
            }
        },
        ["toDelete"],
    )
    return {
        "type": "object",
        "properties": {"spec": spec, "status": ScaleInStatus.schema()},
    }
