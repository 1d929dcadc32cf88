"""S1: the default suite (`make test`) beside a user's demo that trains: how long the suite
takes, and whether the demo answers kubectl and trains on throughout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from bench.common import Row
from bench.training import long_example
from localcluster import procs
from localcluster.world import ROOT

JOB = "beside"
POLL = 5.0  # seconds between the demo's kubectl answers looked for


def s1(tmp: Path) -> list[Row]:
    state = tmp / "demo"
    demo, env = demo_up(state, tmp / "demo.log")
    try:
        body = long_example(replicas=2)
        body["metadata"]["name"] = JOB
        kubectl(env, "create", "-f", "-", input=yaml.safe_dump(body))
        kubectl(env, "wait", f"trainingjob/{JOB}", "--for=jsonpath={.status.phase}=Running",
                "--timeout=300s")  # fmt: skip
        return suite_beside(env, tmp / "suite.log")
    finally:
        subprocess.run(
            [sys.executable, "-m", "localcluster.demo", "--down", "--dir", str(state)],
            cwd=ROOT, capture_output=True, timeout=300,
        )  # fmt: skip
        demo.wait(60)


def demo_up(state: Path, log: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """`make demo` under its own --dir, its tour done; the environment its kubectl needs (what
    it prints to export)."""
    port = str(procs.free_port())
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "localcluster.demo", "--dir", str(state), "--api-port", port],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 1200
    while "stops it" not in log.read_text():
        if demo.poll() is not None or time.monotonic() > deadline:
            demo.kill()
            raise AssertionError("the demo did not come up: " + log.read_text()[-1500:])
        time.sleep(1)
    env = dict(os.environ)
    for line in log.read_text().splitlines():
        line = line.strip()
        if line.startswith("export KUBECONFIG="):
            env["KUBECONFIG"] = line.split("=", 1)[1]
        elif line.startswith("export PATH="):
            env["PATH"] = line.split("=", 1)[1].replace("$PATH", env.get("PATH", ""))
    return demo, env


def kubectl(env: dict[str, str], *args: str, input: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args], env=env, input=input, capture_output=True, text=True, check=True,
        timeout=330,
    ).stdout  # fmt: skip


def suite_beside(env: dict[str, str], log: Path) -> list[Row]:
    """`make test` in this checkout while the demo's job is asked for its phase every POLL s."""
    answers: Counter[str] = Counter()
    t0 = time.monotonic()
    with open(log, "wb") as out:
        suite = subprocess.Popen(["make", "test"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    while suite.poll() is None:
        got = subprocess.run(
            ["kubectl", "get", "trainingjob", JOB, "-o", "jsonpath={.status.phase}",
             "--request-timeout=5s"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        answers[got.stdout.strip() if got.returncode == 0 else "no answer"] += 1
        time.sleep(POLL)
    minutes = (time.monotonic() - t0) / 60
    summary = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
    seen = ", ".join(f"{k} {n}" for k, n in answers.most_common())
    return [
        ("S1", "make test beside a demo training a job", f"{minutes:.1f} min", "<= 16 min"),
        ("S1", "... the suite's own word", summary[0][-60:], f"exit 0 (got {suite.returncode})"),
        ("S1", f"... the demo's job, asked every {POLL:.0f} s", seen, "Running each time"),
    ]
