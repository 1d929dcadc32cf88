"""`make demo`, end to end: the local cluster comes up stage by stage, the tour (ScaleOut +2,
ScaleIn by count and by name, kubectl scale, a killed worker) trains through every step to a
Succeeded job, the cluster stays up until `make demo-down`, and stopping leaves no process,
mount point or directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import procs
from tests.harness import ROOT

pytestmark = pytest.mark.fullchain


def processes_mentioning(text: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d.name}: {cmd[:120]}")
    return found


def host_state() -> dict[str, object]:
    """What a local cluster changes on this machine while it runs: the kubelet's sysctls, mounts,
    links (bridge, veths), network namespaces, cgroups, and the pods' network results containerd
    keeps in /var/lib/cni."""
    sysctls = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory")
    netns, results = Path("/run/netns"), Path("/var/lib/cni/results")
    return {
        "cni results": sorted(p.name for p in results.iterdir()) if results.is_dir() else [],
        "sysctls": [(Path("/proc/sys") / k).read_text().strip() for k in sysctls],
        "mounts": sorted(line.split()[4] for line in open("/proc/self/mountinfo")),
        "links": sorted(
            line.split(":")[1].strip()
            for line in subprocess.run(
                ["ip", "-o", "link"], capture_output=True, text=True
            ).stdout.splitlines()
        ),
        "netns": sorted(p.name for p in netns.iterdir()) if netns.exists() else [],
        "cgroups": sorted(p.name for p in Path("/sys/fs/cgroup/pids").iterdir() if p.is_dir()),
    }


def test_demo_tour_end_to_end_then_demo_down(tmp_path: Path) -> None:
    """The tour, then the demo keeps running until `make demo-down` (no arguments) stops it,
    although it was started with ARGS="--dir X"."""
    state, results = tmp_path / "demo", tmp_path / "timings.json"
    before = host_state()
    demo = subprocess.Popen(
        [
            sys.executable, "-m", "localcluster.demo",
            "--dir", str(state), "--api-port", str(procs.free_port()), "--results", str(results),
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        seen = []
        for line in demo.stdout:
            seen.append(line)
            if "stops it" in line:
                break
        out = "".join(seen)
        print(out[-6000:])
        for stage in (
            "control-plane binaries ready",
            "control plane up",
            "node(s) Ready",
            "operator deployed",
            "job Succeeded",
            "tour done",
            "The cluster keeps running",
            "export KUBECONFIG=",
            "kubectl create -f examples/scale_out.yaml",
        ):
            assert stage in out, out[-3000:]
        assert "elastic-training-scaleout" in out  # what kubectl get tj,so,si showed
        timings = json.loads(results.read_text())
        assert set(timings) == {
            "steps_per_s_at_2", "scale_out_+2", "scale_in_count_1", "scale_in_by_name",
            "kubectl_scale_3", "worker_killed",
        }  # fmt: skip
        down = subprocess.run(
            ["make", "demo-down"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0 and "stopped the demo" in down.stdout, down.stdout
        assert demo.wait(60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
    # Nothing left behind: no process, no state directory, this machine as it was.
    assert processes_mentioning(str(state)) == []
    assert not state.exists()
    assert host_state() == before


def test_demo_refuses_a_port_in_use_clearly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "localcluster.demo", "--exit",
             "--dir", str(tmp_path / "d"), "--api-port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2
    assert f"port {port} is in use" in out.stderr
    assert not (tmp_path / "d").exists()
