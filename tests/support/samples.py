"""What the digits example's `--log-samples` files say about each epoch: was every sample
trained, and was any sample trained twice for a reason other than a rollback.

A line is `<epoch> <commit> <attempt> <t> <index> ...`: one batch of one worker process, trained
after `commit` commits, in the process's `attempt`-th incarnation (it counts its resets), at
time `t`. A worker failure rolls every survivor back to the last commit: the survivors train
batches under that commit number again, in a later attempt. So a commit group that one process
trained in two attempts was rolled back, and its lines from before the rollback (the first line
of the later attempt) were lost: their updates were thrown away, so the samples are trained
again and count only once. Graceful resizes happen at a commit and lose nothing.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, replace
from pathlib import Path

Group = tuple[int, int]  # (epoch, commit)


@dataclass(frozen=True)
class Batch:
    process: str
    epoch: int
    commit: int
    attempt: int
    t: float
    indices: tuple[int, ...]


@dataclass
class Coverage:
    """Per epoch: samples never trained, samples trained more than once outside a rollback, and
    the commit groups that were rolled back."""

    missed: dict[int, int] = field(default_factory=dict)
    repeated: dict[int, int] = field(default_factory=dict)
    rolled_back: list[Group] = field(default_factory=list)
    lost_samples: int = 0

    def problems(self, padding: int) -> list[str]:
        """`padding`: repeats an epoch may have from the sampler evening out the last shards
        (at most one fewer than the number of ranks)."""
        out = [f"epoch {e}: {n} samples never trained" for e, n in self.missed.items() if n]
        out += [
            f"epoch {e}: {n} samples trained again without a rollback (padding allows {padding})"
            for e, n in self.repeated.items()
            if n > padding
        ]
        return out


def read(directory: Path) -> list[Batch]:
    batches = []
    for path in sorted(directory.glob("*.log")):
        for line in path.read_text().splitlines():
            epoch, commit, attempt, t, *indices = line.split()
            batches.append(
                Batch(path.stem, int(epoch), int(commit), int(attempt), float(t),
                      tuple(map(int, indices)))
            )  # fmt: skip
    return batches


def rollbacks(batches: list[Batch]) -> dict[Group, float]:
    """Each rolled-back commit group and when it was last rolled back: the earliest first line
    of a process's last attempt in the group, among processes that trained it before."""
    attempts: dict[tuple[Group, str], dict[int, float]] = collections.defaultdict(dict)
    for b in batches:
        first = attempts[(b.epoch, b.commit), b.process]
        first[b.attempt] = min(first.get(b.attempt, b.t), b.t)
    at: dict[Group, float] = {}
    for (group, _), firsts in attempts.items():
        if len(firsts) > 1:
            later = firsts[max(firsts)]
            at[group] = min(at.get(group, later), later)
    return at


def coverage(batches: list[Batch], dataset_size: int) -> Coverage:
    rolled = rollbacks(batches)
    result = Coverage(rolled_back=sorted(rolled))
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for b in batches:
        group = (b.epoch, b.commit)
        if group in rolled and b.t < rolled[group]:
            result.lost_samples += len(b.indices)
            continue
        counts[b.epoch].update(b.indices)
    for epoch, seen in sorted(counts.items()):
        result.missed[epoch] = len(set(range(dataset_size)) - set(seen))
        result.repeated[epoch] = sum(n - 1 for n in seen.values())
    return result


def resumed(batches: list[Batch], dataset_size: int) -> tuple[Coverage, list[Batch]]:
    """The Torchrun digits script's lines (examples/torchrun/digits.py), read by `read`: there
    `commit` is the batch's position in its epoch's order and `attempt` its process's start (ms).
    Each run resumes from a checkpoint: a batch is lost (its update not in any later run's
    model) when a process started after it trained resumed at or before its place. The
    coverage counts the batches kept; the lost ones are returned beside it."""
    firsts: dict[int, tuple[int, int]] = {}
    for b in batches:
        firsts[b.attempt] = min(firsts.get(b.attempt, (b.epoch, b.commit)), (b.epoch, b.commit))
    kept: list[Batch] = []
    lost: list[Batch] = []
    for b in batches:
        redone = any(s / 1000 > b.t and at <= (b.epoch, b.commit) for s, at in firsts.items())
        (lost if redone else kept).append(b)
    result = coverage([replace(b, attempt=0) for b in kept], dataset_size)
    result.lost_samples = sum(len(b.indices) for b in lost)
    return result, lost
