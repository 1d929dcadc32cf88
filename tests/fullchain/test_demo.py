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
from typing import cast

import pytest

from localcluster import procs
from localcluster.cluster import clear_killed_runs
from localcluster.network import NETNS_DIR, SLOTS, free_slots
from localcluster.nodeclean import NAMESPACES
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


# buildah's storage: an image build (a cluster's start builds the images its sources changed,
# in another test's process too) mounts its layers there while it runs; no node or pod does.
BUILDS = "/var/lib/containers/storage"


def host_state() -> dict[str, object]:
    """What a local cluster changes on this machine while it runs: the kubelet's sysctls, mounts,
    links (bridge, veths), network namespaces, cgroups, and the pods' network results containerd
    keeps in /var/lib/cni."""
    sysctls = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory")
    netns, results = Path("/run/netns"), Path("/var/lib/cni/results")
    return {
        "cni results": sorted(p.name for p in results.iterdir()) if results.is_dir() else [],
        "sysctls": [(Path("/proc/sys") / k).read_text().strip() for k in sysctls],
        "mounts": sorted(
            point
            for point in (line.split()[4] for line in open("/proc/self/mountinfo"))
            if not point.startswith(BUILDS)
        ),
        "links": sorted(
            line.split(":")[1].strip()
            for line in subprocess.run(
                ["ip", "-o", "link"], capture_output=True, text=True
            ).stdout.splitlines()
        ),
        "netns": sorted(p.name for p in netns.iterdir()) if netns.exists() else [],
        "cgroups": sorted(p.name for p in Path("/sys/fs/cgroup/pids").iterdir() if p.is_dir()),
    }


def machine_as_found() -> dict[str, object]:
    """This machine's state once what runs killed before they could stop left is cleared (a
    cluster's start clears it too: see the test below), so that it is not counted as ours."""
    clear_killed_runs()
    return host_state()


def others(state: dict[str, object], slots: set[int]) -> dict[str, object]:
    """`state` without what belongs to clusters of other slots (a user's demo running beside
    the suite changes its own pods' links and results meanwhile)."""
    marks = [f"etok{k}" for k in slots]
    # A pod's loopback result carries its container's id, not its network's (slot's) name.
    results = [str(x) for x in state["cni results"]]  # type: ignore[attr-defined]
    marks += [
        r.split("-")[2] for r in results if any(r.startswith(f"etoperator-{m}-") for m in marks)
    ]
    if slots:
        # A pod of theirs made between its two results: its loopback one, unnamed. And what
        # all clusters share (the kubelets' sysctls, the namespaces' mounts) is the last one's
        # to put back: while theirs run, it stays.
        marks += [r for r in results if not r.startswith("etoperator-etok")]
        marks += [str(NAMESPACES), str(NETNS_DIR)]
    return {
        k: [x for x in v if not any(m in str(x) for m in marks)] if k != "sysctls" else v
        for k, v in state.items()
        if isinstance(v, list) and not (slots and k == "sysctls")
    }


def assert_as_found(before: dict[str, object], theirs: set[int]) -> None:
    """This machine as `before` (but for clusters of `theirs` or holding a slot now); a failure
    names what differs (a mount among a hundred, once under the suite's load). The slots held
    are read on both sides of the state: a cluster starting holds its slot before it mounts
    anything, one stopping holds it until it unmounted everything."""
    theirs = theirs | held_slots()
    state = host_state()
    theirs |= held_slots()
    now, was = others(state, theirs), others(before, theirs)
    differs = {
        k: {"added": sorted(listed(v) - listed(was[k])), "gone": sorted(listed(was[k]) - listed(v))}
        for k, v in now.items()
        if v != was[k]
    }
    assert not differs, differs


def listed(items: object) -> set[str]:
    return {str(x) for x in cast(list[object], items)}


def held_slots() -> set[int]:
    """The slots other clusters hold now (a demo of the user's, another test run)."""
    return set(range(SLOTS)) - set(free_slots())


def demo_up(state: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`make demo` with ARGS="--dir state ...", read until it waits to be stopped."""
    demo = subprocess.Popen(
        [
            sys.executable, "-m", "localcluster.demo",
            "--dir", str(state), "--api-port", str(procs.free_port()), *args,
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert demo.stdout is not None
    seen = []
    for line in demo.stdout:
        seen.append(line)
        if "stops it" in line:
            break
    return demo, "".join(seen)


def failure(out: str) -> str:
    """What to show of a failed demo: the failed step's scene whole (the objects, events, the
    operator's and horovodrun's lines), else the output's end."""
    at = out.find("--- objects")
    return out[max(0, at - 500) :][-12000:] if at >= 0 else out[-3000:]


def demo_down(state: Path) -> subprocess.CompletedProcess[str]:
    """`make demo-down` for this test's demo only: without --dir it would stop every demo on
    this machine, a user's too."""
    return subprocess.run(
        ["make", "demo-down", f"ARGS=--dir {state}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_demo_tour_end_to_end_then_demo_down(tmp_path: Path) -> None:
    """The tour, then the demo keeps running until `make demo-down` stops it."""
    state, results = tmp_path / "demo", tmp_path / "timings.json"
    before, theirs = machine_as_found(), held_slots()
    demo, out = demo_up(state, "--results", str(results))
    try:
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
            assert stage in out, failure(out)
        assert "elastic-training-scaleout" in out  # what kubectl get tj,so,si showed
        timings = json.loads(results.read_text())
        assert set(timings) == {
            "steps_per_s_at_2", "scale_out_+2", "scale_in_count_1", "scale_in_by_name",
            "kubectl_scale_3", "worker_killed", "queued_job_running_after_first_ends",
        }  # fmt: skip
        for seen in (
            "queued-b waits: queued in team-queue",
            "waiting for queue team-queue to admit 3 workers",
            "rolled back: not admitted within 20s",
            "queued-a deleted; queued-b admitted and running",
        ):
            assert seen in out, out[-3000:]  # fmt: skip
        down = demo_down(state)
        assert down.returncode == 0 and "stopped the demo" in down.stdout, down.stdout
        assert demo.wait(60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
    # Nothing left behind: no process, no state directory, this machine as it was.
    assert processes_mentioning(str(state)) == []
    assert not state.exists()
    assert_as_found(before, theirs)  # a cluster of the suite's other tiers may run meanwhile


def test_a_killed_demo_leaves_nothing_once_demo_down_runs(tmp_path: Path) -> None:
    """A demo killed outright (SIGKILL: it stops nothing) leaves its pods running, its node's
    namespaces, links, cgroups, mounts and the pods' network results; `make demo-down` finds no
    demo to stop and clears all of it, leaving this machine as it was."""
    state = tmp_path / "demo"
    before, theirs = machine_as_found(), held_slots()
    demo, out = demo_up(state, "--no-tour")
    try:
        assert "operator deployed" in out, out[-3000:]
        up = host_state()
        assert up["netns"] != before["netns"] and up["cni results"] != before["cni results"]
    finally:
        demo.kill()
        demo.wait(60)
    theirs |= held_slots()  # a cluster of the suite's other tiers may have started meanwhile
    assert others(host_state(), theirs)["netns"] == others(up, theirs)["netns"]  # left
    down = demo_down(state)
    assert down.returncode == 0 and "no demo is running" in down.stdout, down.stdout
    assert "cleared what" in down.stdout, down.stdout
    assert_as_found(before, theirs)
    assert processes_mentioning(str(state)) == []


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
