"""The digits example's bookkeeping under plain `horovodrun` (2 local ranks): every sample of
every epoch is trained, a sample twice only as the sampler's padding to equal shards, and the
model learns (held-out accuracy)."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.fullchain
TRAIN_SAMPLES = 1437  # 80 % of the 1,797 digits


def trained_per_epoch(logs: Path) -> dict[int, collections.Counter[int]]:
    seen: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for log in logs.glob("rank-*.log"):
        for line in log.read_text().splitlines():
            epoch, _commit, *indices = map(int, line.split())
            seen[epoch].update(indices)
    return seen


def test_every_sample_of_every_epoch_is_trained(tmp_path: Path) -> None:
    venv = Path(sys.executable).parent
    out = subprocess.run(
        [
            str(venv / "horovodrun"), "-np", "2", "-H", "localhost:2", sys.executable,
            str(ROOT / "examples/digits_train.py"), "--epochs", "4",
            "--log-samples", str(tmp_path / "samples"),
        ],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    seen = trained_per_epoch(tmp_path / "samples")
    assert sorted(seen) == [0, 1, 2, 3]
    for epoch, counts in seen.items():
        assert len(counts) == TRAIN_SAMPLES, f"epoch {epoch}: {TRAIN_SAMPLES - len(counts)} missed"
        repeats = sum(n - 1 for n in counts.values())
        assert repeats <= 1, f"epoch {epoch}: {repeats} repeated (padding allows 2 - 1)"
    done = re.search(r"DONE .*test_accuracy=([\d.]+)", out.stdout)
    assert done and float(done[1]) >= 0.9, out.stdout[-1000:]
