"""One source of truth: crds/*.yaml are generated from etoperator/api/crds.py (the examples are
validated by the real API server: tests/integration/test_schema_examples.py)."""

from __future__ import annotations

from etoperator.api import crds
from tests.harness import ROOT


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
