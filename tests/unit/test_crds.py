"""One source of truth: crds/*.yaml are generated from etoperator/api/crds.py, and every
example validates against them (with the emulator's schema engine, as the API server would)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from etoperator.api import crds
from etoperator.api.models import parse_job, parse_scaler
from tests.emulator import schema
from tests.harness import ROOT

EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
SCHEMAS = {
    c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for c in crds.all_crds().values()
}


def test_generated_files_match_the_models() -> None:
    for fname, crd in crds.all_crds().items():
        on_disk = (ROOT / "crds" / fname).read_text()
        assert on_disk == crds.render(crd), (
            f"crds/{fname} drifted: run python -m etoperator.api.crds"
        )
    files = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert files == sorted([*crds.all_crds(), "kustomization.yaml"])


def test_crds_are_structural_with_status_and_columns() -> None:
    for crd in crds.all_crds().values():
        version = crd["spec"]["versions"][0]
        assert version["subresources"]["status"] == {}
        assert version["schema"]["openAPIV3Schema"]["type"] == "object"
        cols = [c["name"] for c in version["additionalPrinterColumns"]]
        assert cols[0] == "Phase" and cols[-1] == "Age"
    job = crds.all_crds()["trainingjobs.yaml"]
    assert job["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] == (
        ".spec.etReplicaSpecs.worker.replicas"
    )
    assert [c["spec"]["names"]["shortNames"] for c in crds.all_crds().values()] == [
        ["tj"],
        ["so"],
        ["si"],
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_validates(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("apiVersion") != "kai.alibabacloud.com/v1alpha1":
            continue
        s = SCHEMAS[doc["kind"]]
        body = schema.apply_defaults(schema.prune(doc, s, root=True), s)
        assert schema.validate({k: v for k, v in body.items() if k != "metadata"}, s) == []
        # Nothing the user wrote is pruned away in the spec.
        assert body["spec"] == schema.apply_defaults(doc["spec"], s["properties"]["spec"])
        if doc["kind"] == "TrainingJob":
            body["metadata"].setdefault("namespace", "default")
            parse_job(body)
        else:
            parse_scaler(doc["kind"], body)


def test_pod_template_metadata_survives_pruning() -> None:
    doc = yaml.safe_load((ROOT / "examples/training_job.yaml").read_text())
    doc["spec"]["etReplicaSpecs"]["worker"]["template"]["metadata"] = {
        "labels": {"a": "b"},
        "annotations": {"c": "d"},
    }
    doc["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["tolerations"] = [{"key": "x"}]
    pruned = schema.prune(doc, SCHEMAS["TrainingJob"], root=True)
    tpl = pruned["spec"]["etReplicaSpecs"]["worker"]["template"]
    assert tpl["metadata"] == {"labels": {"a": "b"}, "annotations": {"c": "d"}}
    assert tpl["spec"]["tolerations"] == [{"key": "x"}]
