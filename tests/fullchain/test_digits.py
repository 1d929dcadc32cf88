"""Training as users run it: the digits example (a real data set, a CNN, ElasticSampler) as a
TrainingJob through ScaleOut +2, ScaleIn by count, ScaleIn by name, a suspension mid-epoch
and a killed worker, against the same epochs under plain `horovodrun` in the same test. Every
sample of every epoch is trained; a sample is trained twice only after the killed worker rolled
training back to the last commit (or as the sampler's padding to equal shards): the run after
the suspension went on from the sample its save stopped at, on the job's shared volume; the
final test accuracy is within a point of the static run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import digits
from tests.harness import Chain
from tests.support import samples

pytestmark = pytest.mark.fullchain
EPOCHS = digits.EPOCHS


def test_elastic_run_trains_every_sample_and_matches_a_static_run(
    chain: Chain, tmp_path: Path
) -> None:
    # The reference on one rank: most of the elastic run's epochs are on one worker (after the
    # kill), and two ranks on two cores cost twice its CPU (160 s of a suite) for no more.
    ran = tmp_path / "static"
    static = digits.kept(
        lambda: digits.static(EPOCHS, ranks=1, samples=ran), "horovodrun", EPOCHS, 1, samples=ran
    )
    cov = samples.coverage(samples.read(tmp_path / "static"), digits.TRAIN_SAMPLES)
    assert cov.problems(padding=0) == [] and cov.rolled_back == []
    assert sorted(cov.missed) == list(range(EPOCHS))

    ns = chain.new_namespace()
    job = digits.Elastic.on(chain, ns)
    job.create(EPOCHS, tmp_path / "elastic")
    timings = job.tour()
    elastic = job.run()
    batches = samples.read(tmp_path / "elastic")
    cov = samples.coverage(batches, digits.TRAIN_SAMPLES)
    print(f"elastic transitions (s): {timings}")
    print(f"rolled back: {cov.rolled_back}, {cov.lost_samples} samples lost and trained again")
    assert sorted(cov.missed) == list(range(EPOCHS))
    assert cov.problems(padding=digits.MAX_RANKS - 1) == []
    # Graceful resizes roll nothing back: what was rolled back, was after the kill.
    assert all(t >= job.killed_at for t in samples.rollbacks(batches).values())

    assert static.accuracy is not None and elastic.accuracy is not None, elastic.text[-2000:]
    print(f"test accuracy after {EPOCHS} epochs: static {static.accuracy:.4f}, elastic "
          f"{elastic.accuracy:.4f}")  # fmt: skip
    assert static.accuracy >= 0.95
    assert abs(elastic.accuracy - static.accuracy) <= 0.01
