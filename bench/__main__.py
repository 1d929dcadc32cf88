"""Benchmarks: `make bench` (or `python -m bench [--only p1 p5 p7 p8 p4 p6 a1 ...]`).

Prints a table of figures against their goals. Not pass/fail: a figure that misses its goal is
printed as such. Uses the local cluster: P5, P7, P8 and P9 the real control plane with
kube-scheduler and hollow nodes (kubemark: the real kubelet over a fake runtime), the operator
as a real process under its deploy/ RBAC; P1-P4, P6, A1 and P10 real nodes (containerd, the
shipped images, workers with a real sshd, the operator deployed from deploy/, real horovodrun
training where the figure is training's); T1 real nodes and real torchrun, resized under the
operator and as torchrun is; S1 the default suite beside a demo that trains.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.beside import s1
from bench.common import Row
from bench.discovery import p1_p2_p3
from bench.gangs import g1
from bench.goodput import q3a
from bench.ha import ha, p10
from bench.preempt import q2, q3
from bench.queues import q1
from bench.scale import p5, p9
from bench.scaleloop import p7
from bench.takeover import p8
from bench.torchrun import t1, t1_horovod, t1_torchrun
from bench.training import accuracy, kills, p4, p6


def main() -> int:
    # SIGTERM (a `timeout`, a CI's stop) ends the run as Ctrl-C does, through every stage's
    # cleanup: killed outright it left its nodes' pods running until the next cluster here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--only", nargs="*", help="stages by name (default: all, in order)")
    p.add_argument("--minutes", type=float, default=5.0, help="P7's length")
    args = p.parse_args()
    rows: list[Row] = []
    stages: list[tuple[str, Callable[[Path], list[Row]]]] = [
        ("p1", lambda t: p1_p2_p3(t, args.rounds)),
        ("p5", lambda t: p5(t, args.jobs, args.workers)),
        ("p7", lambda t: p7(t, minutes=args.minutes)),
        ("p8", p8),
        ("p9", p9),
        ("p4", p4),
        ("kills", kills),
        ("p6", p6),
        ("a1", accuracy),
        ("p10", p10),
        ("ha", ha),
        ("q1", q1),
        ("q2", lambda t: q2(t, args.rounds)),
        ("q3", q3),
        ("q3a", q3a),
        ("g1", g1),
        ("t1", lambda t: t1(t, args.rounds)),
        ("t1h", lambda t: t1_horovod(t, args.rounds)),
        ("t1t", lambda t: t1_torchrun(t, args.rounds)),
        ("s1", s1),
    ]
    with tempfile.TemporaryDirectory() as d:
        for name, stage in stages:
            if (args.only and name not in args.only) or (not args.only and name in PARTS):
                continue
            (Path(d) / name).mkdir(parents=True, exist_ok=True)
            try:
                got = stage(Path(d) / name)
            except Exception as exc:  # a stage that fails is a row; the others still run
                got = [(name.upper(), "stage failed", type(exc).__name__, str(exc)[:60])]
            for row in got:  # print as they come: a later stage cannot lose them
                print("  ".join(row), flush=True)
            rows += got
    print_table(rows)
    return 0


# Parts of a stage, run when asked by name: a whole run has them in the stage (t1).
PARTS = {"t1h", "t1t"}


def print_table(rows: list[Row]) -> None:
    """Every figure against its goal, after the machine it was measured on."""
    print(
        f"\nmachine: {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    )
    width = max(len(r[1]) for r in rows)
    print(f"{'id':4} {'measure':{width}} {'figure':36} goal")
    for r in rows:
        print(f"{r[0]:4} {r[1]:{width}} {r[2]:36} {r[3]}")


if __name__ == "__main__":
    sys.exit(main())
