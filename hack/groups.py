"""The seconds each group of tests/conftest.py (one worker process each) took in a run, from
its junit file: where the suite's wall time goes, to balance the groups by."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import group_of  # the checkout's own, by path


def main(path: str) -> int:
    sums: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        module = str(case.get("classname") or "").replace(".", "/") + ".py"
        sums[group_of(f"{module}::{case.get('name')}")] += float(case.get("time") or 0)
    for group, secs in sorted(sums.items(), key=lambda kv: -kv[1])[:8]:
        print(f"{secs:8.0f} s  {group}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/junit.xml"))
