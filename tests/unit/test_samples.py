"""The sample-coverage check the full chain applies to the digits example's logs: it must
catch a missed sample and a repeat without a rollback, and forgive what a rollback retrains."""

from __future__ import annotations

from tests.support.samples import Batch, coverage

SIZE = 8


def batch(process: str, epoch: int, commit: int, attempt: int, t: float, *idx: int) -> Batch:
    return Batch(process, epoch, commit, attempt, t, idx)


def clean_epoch(epoch: int, t: float) -> list[Batch]:
    """Two ranks, batches of 2, a commit every batch: samples 0..7 once each."""
    return [
        batch("a", epoch, 2 * epoch, 0, t, 0, 2),
        batch("b", epoch, 2 * epoch, 0, t, 1, 3),
        batch("a", epoch, 2 * epoch + 1, 0, t + 1, 4, 6),
        batch("b", epoch, 2 * epoch + 1, 0, t + 1, 5, 7),
    ]


def test_a_clean_run_has_no_problem() -> None:
    cov = coverage(clean_epoch(0, 0) + clean_epoch(1, 10), SIZE)
    assert cov.problems(padding=1) == [] and cov.rolled_back == []
    assert cov.missed == {0: 0, 1: 0} and cov.repeated == {0: 0, 1: 0}


def test_a_missed_sample_is_reported() -> None:
    log = [*clean_epoch(0, 0)[:-1], batch("b", 0, 1, 0, 1, 5)]
    assert coverage(log, SIZE).problems(padding=1) == ["epoch 0: 1 samples never trained"]


def test_a_repeat_after_a_graceful_resize_is_reported() -> None:
    # A resize at commit 1 whose sampler lost track of what the epoch had trained.
    log = [*clean_epoch(0, 0)[:2], batch("a", 0, 1, 1, 1, 2, 3, 4, 5, 6, 7)]
    cov = coverage(log, SIZE)
    assert cov.rolled_back == []
    assert cov.problems(padding=1) == [
        "epoch 0: 2 samples trained again without a rollback (padding allows 1)"
    ]


def test_padding_within_its_allowance_is_not_a_problem() -> None:
    log = [*clean_epoch(0, 0), batch("c", 0, 1, 0, 1, 0)]
    assert coverage(log, SIZE).problems(padding=1) == []
    assert coverage([*log, batch("c", 0, 1, 0, 1, 1)], SIZE).problems(padding=1) != []


def test_what_a_rollback_retrains_is_forgiven_and_counted() -> None:
    # Process c dies during commit group 1; a and b roll back to commit 1 and train it again.
    log = [
        *clean_epoch(0, 0)[:2],
        batch("a", 0, 1, 0, 1, 4),
        batch("b", 0, 1, 0, 1, 5),
        batch("c", 0, 1, 0, 1, 6),
        batch("a", 0, 1, 1, 5, 4, 6),
        batch("b", 0, 1, 1, 5, 5, 7),
    ]
    cov = coverage(log, SIZE)
    assert cov.rolled_back == [(0, 1)] and cov.lost_samples == 3
    assert cov.problems(padding=1) == []
    # Had the retrained lines not covered 7, it would still be missed.
    assert coverage(log[:-1], SIZE).problems(padding=1) == ["epoch 0: 2 samples never trained"]
