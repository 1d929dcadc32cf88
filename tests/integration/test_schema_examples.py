"""Every example is accepted by the real API server as written (kubectl, validation on), keeps
all that the user wrote through the CRD's pruning, and parses as the operator reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from etoperator.api.models import parse_job
from etoperator.api.scalers import parse_scaler
from tests.harness import ROOT, Cluster

pytestmark = pytest.mark.integration
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").rglob("*.yaml")
    if "apiVersion: kai.alibabacloud.com" in p.read_text()
    or "apiVersion: kueue.x-k8s.io" in p.read_text()
)


def _dry_run(cluster: Cluster, ns: str, doc: dict[str, Any]) -> dict[str, Any]:
    ns = doc.get("metadata", {}).get("namespace") or ns  # an example may name its own
    res = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-",
        input=yaml.safe_dump(doc), check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_is_accepted_unchanged(cluster: Cluster, ns: str, path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        body = _dry_run(cluster, ns, doc)  # Kueue's too: its CRDs and webhooks accept them
        if doc.get("apiVersion") != "kai.alibabacloud.com/v1alpha1":
            continue
        spec = body["spec"]
        assert isinstance(spec, dict)
        _assert_kept(doc["spec"], spec)
        if doc["kind"] == "TrainingJob":
            parse_job(body)
        else:
            parse_scaler(doc["kind"], body)


def _assert_kept(wrote: object, stored: object, path: str = "spec") -> None:
    """Everything the user wrote is stored as written (defaults may add fields)."""
    if isinstance(wrote, dict):
        assert isinstance(stored, dict), path
        for k, v in wrote.items():
            assert k in stored, f"{path}.{k} was pruned"
            _assert_kept(v, stored[k], f"{path}.{k}")
    else:
        assert wrote == stored, f"{path}: wrote {wrote!r}, stored {stored!r}"


def test_pod_template_metadata_survives_pruning(cluster: Cluster, ns: str) -> None:
    doc = yaml.safe_load((ROOT / "examples/training_job.yaml").read_text())
    worker = doc["spec"]["etReplicaSpecs"]["worker"]["template"]
    worker["metadata"] = {"labels": {"a": "b"}, "annotations": {"c": "d"}}
    worker["spec"]["tolerations"] = [{"key": "x", "operator": "Exists"}]
    body = _dry_run(cluster, ns, doc)
    tpl = body["spec"]["etReplicaSpecs"]["worker"]["template"]
    assert tpl["metadata"] == {"labels": {"a": "b"}, "annotations": {"c": "d"}}
    assert tpl["spec"]["tolerations"] == [{"key": "x", "operator": "Exists"}]
