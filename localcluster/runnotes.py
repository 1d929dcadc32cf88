"""What a test run should tell beyond pass and fail, noted where the suite asks
(`$ETO_RUN_NOTES`) and printed at its end (tests/conftest.py): the waits that took over half
their deadline (a wait near its deadline is the next failure on a slower or busier machine,
told before it fails), and remarks a test makes on what it measured."""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "ETO_RUN_NOTES"


def slow_wait(what: str, took: float, timeout: float) -> None:
    if took > timeout / 2:
        _note({"what": what, "took": round(took, 1), "timeout": timeout})


def remark(text: str) -> None:
    _note({"remark": text})


def _note(fields: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    with open(path, "a") as f:  # one short append: whole lines from several processes
        f.write(json.dumps({"test": test, **fields}) + "\n")


def read(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The slow waits, nearest their deadline first, and the remarks in their order."""
    try:
        with open(path) as f:
            got = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return [], []
    waits = sorted((n for n in got if "took" in n), key=lambda w: -w["took"] / w["timeout"])
    return waits, [n for n in got if "remark" in n]
