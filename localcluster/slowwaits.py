"""Waits that took over half their deadline, noted where the suite asks (`$ETO_SLOW_WAITS`): a
wait near its deadline is the next failure on a slower or busier machine, told before it fails.
The suite prints them at its end (tests/conftest.py)."""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "ETO_SLOW_WAITS"


def note(what: str, took: float, timeout: float) -> None:
    path = os.environ.get(ENV)
    if not path or took <= timeout / 2:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    line = json.dumps({"test": test, "what": what, "took": round(took, 1), "timeout": timeout})
    with open(path, "a") as f:  # one short append: whole lines from several processes
        f.write(line + "\n")


def read(path: str) -> list[dict[str, Any]]:
    """The waits noted, nearest their deadline first."""
    try:
        with open(path) as f:
            got = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return sorted(got, key=lambda w: -w["took"] / w["timeout"])
