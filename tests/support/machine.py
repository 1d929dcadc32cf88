"""What else the machine is doing: a run that is slow for no reason of its own (another run's
pods still training, a build) says so at its end instead of failing its deadlines unexplained."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[int, tuple[str, int]]:
    """Each process's name and CPU ticks so far (user and system)."""
    found = {}
    for d in PROC.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        fields = rest.split()
        found[int(d.name)] = (name, int(fields[11]) + int(fields[12]))
    return found


def busiest(seconds: float = 1.0, most: int = 5, floor: float = 0.1) -> list[str]:
    """The processes that used more than `floor` of a core over the next `seconds`, busiest
    first, as 'name (pid): share'."""
    before = cpu_ticks()
    time.sleep(seconds)
    used = []
    for pid, (name, ticks) in cpu_ticks().items():
        share = (ticks - before.get(pid, (name, ticks))[1]) / TICKS / seconds
        if share > floor:
            used.append((share, f"{name} ({pid}): {share:.2f}"))
    return [what for _, what in sorted(used, reverse=True)[:most]]


def snapshot() -> str:
    """The load average and the busiest processes now, on one line."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    busy = busiest()
    return f"load {' '.join(load)}; busiest: {', '.join(busy) or 'none over a tenth of a core'}"
