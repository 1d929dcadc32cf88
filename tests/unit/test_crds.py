"""One source of truth: crds/*.yaml are generated from etoperator/api/crds.py (the examples are
validated by the real API server: tests/integration/test_schema_examples.py)."""

from __future__ import annotations

from typing import Any

import pytest

from etoperator.api import crds, fields
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


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
    return node


JOB_FIELDS = [
    fields.REPLICAS, fields.MIN_REPLICAS, fields.MAX_REPLICAS, fields.LAUNCHER_REPLICAS,
    fields.SLOTS, fields.CLEAN_POD, fields.JOB_RESTART, fields.BACKOFF, fields.ATTACH,
]  # fmt: skip
SCALER_FIELDS = [fields.TIMEOUT, fields.SCALER_BACKOFF]


@pytest.mark.parametrize("field", [*JOB_FIELDS, *SCALER_FIELDS], ids=lambda f: f.path)
def test_schema_and_parsing_come_from_one_field_table(field: fields.Int | fields.Enum) -> None:
    kind = "trainingjobs.yaml" if field in JOB_FIELDS else "scaleouts.yaml"
    crd = crds.all_crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    in_schema = _at(crd, field.path)
    assert {k: v for k, v in in_schema.items() if k != "default"} == {
        k: v for k, v in field.schema().items() if k != "default"
    }
    assert in_schema.get("default") in (None, field.default)
    bad = (
        (field.maximum + 1 if field.maximum is not None else -1)
        if isinstance(field, fields.Int)
        else "nonsense"
    )
    with pytest.raises(fields.InvalidSpec, match=field.path.replace(".", r"\.")):
        field.parse(bad)
