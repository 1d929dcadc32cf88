"""What a launcher says (pure): the lines of its log a ScaleOut that waits on Horovod reports,
naming its new workers; the save its preStop reported before it stopped."""

from __future__ import annotations

import re
from typing import Any

SAVED = re.compile(r"step=\d+ t=\d+(\.\d+)?")


def said_saved(pod: dict[str, Any]) -> str:
    """The save report a stopped container left as its termination message ("" if none): the
    launcher's own as its run stopped, else its init container's (the last save of all)."""
    status = pod.get("status") or {}
    for cs in [
        *(status.get("containerStatuses") or []),
        *(status.get("initContainerStatuses") or []),
    ]:
        message = str(((cs.get("state") or {}).get("terminated") or {}).get("message") or "")
        if SAVED.fullmatch(message.strip()):
            return message.strip()
    return ""


def words_about(log: str, names: list[str], most: int = 3, width: int = 240) -> list[str]:
    """Pure: the last `most` distinct lines of `log` naming one of `names` (as a whole word:
    worker-1 is not worker-10), each cut to `width` characters."""
    found: list[str] = []
    for line in reversed(log.splitlines()):
        text = line.strip()
        if text and any(named(text, n) for n in names) and text[:width] not in found:
            found.append(text[:width])
        if len(found) == most:
            break
    return found[::-1]


def named(text: str, name: str) -> bool:
    at = text.find(name)
    while at >= 0:
        end = at + len(name)
        if (at == 0 or not _word(text[at - 1])) and (end == len(text) or not _word(text[end])):
            return True
        at = text.find(name, at + 1)
    return False


def _word(c: str) -> bool:
    return c.isalnum() or c in "-_"
