"""Horovod's elastic state on the job's shared volume, for the Horovod examples.

Horovod's commits keep a run's state in memory, across resizes and lost workers; a whole stop
(a suspension, an eviction, a new launcher) ends every process. So rank 0 also writes the
state to a file on the shared volume (CHECKPOINT_DIR), and a fresh run starts from it. What
has a `state_dict()` (the model, the optimizer, an ElasticSampler's position) is saved as
one; any other attribute of the state (a step, an epoch) as it is.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from savepoint import write_whole


def save(path: str, state: Any, keys: tuple[str, ...]) -> None:
    """`state`'s `keys`, atomically (a reader sees the old file or the new one)."""
    saved = {k: _value(getattr(state, k)) for k in keys}
    write_whole(path, lambda tmp: torch.save(saved, tmp))


def load(directory: str, name: str, state: Any, keys: tuple[str, ...]) -> str | None:
    """The last save in `directory` (none without one), if any, into `state`, and committed:
    a reset before the next commit goes back to it. The file's path, or None."""
    path = os.path.join(directory, name)
    if not directory or not os.path.exists(path):
        return None
    saved: dict[str, Any] = torch.load(path, weights_only=True)
    for k in keys:
        held = getattr(state, k)
        if hasattr(held, "load_state_dict"):
            held.load_state_dict(saved[k])
        else:
            setattr(state, k, saved[k])
    state.save()
    return path


def _value(held: Any) -> Any:
    return held.state_dict() if hasattr(held, "state_dict") else held
