"""The save handshake as the kubelet runs it (the launcher's preStop, in sh) against a script's
side of it (examples/savepoint.py): a save asked, made, reported, and the hook's bounds."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from types import ModuleType

from etoperator.api.models import parse_job
from etoperator.builders.common import Owner
from etoperator.builders.volumes import save_hook
from localcluster.manifests import torchrun_job
from tests.support.modules import load

OWNER = Owner("TrainingJob", "tr", "uid-1")


def savepoint() -> ModuleType:
    return load("examples/savepoint.py")


def run_hook(directory: Path, report: Path, wait: int) -> float:
    command = save_hook(str(directory), wait, str(report))["exec"]["command"]
    t0 = time.monotonic()
    subprocess.run(command, check=True, timeout=wait + 10)
    return time.monotonic() - t0


def test_a_save_asked_is_made_reported_and_becomes_the_termination_message(
    tmp_path: Path,
) -> None:
    sp = savepoint()
    requests = sp.SaveRequests(str(tmp_path))
    saved: list[int] = []

    def training() -> None:  # a step every 50 ms, as rank 0 runs
        for step in range(1, 400):
            if requests.asked():
                saved.append(step)
                requests.report(step)
                return
            time.sleep(0.05)

    threading.Thread(target=training, daemon=True).start()
    took = run_hook(tmp_path, tmp_path / "message", wait=10)
    assert saved and took < 2, (saved, took)
    assert (tmp_path / "message").read_text().startswith(f"step={saved[0]} t=")


def test_no_wait_where_no_script_honours_it_and_at_most_the_bound_where_none_answers(
    tmp_path: Path,
) -> None:
    assert run_hook(tmp_path, tmp_path / "message", wait=5) < 1  # no marker: not asked
    assert not (tmp_path / sp_request()).exists()
    savepoint().SaveRequests(str(tmp_path))  # a script that saves, then hangs
    took = run_hook(tmp_path, tmp_path / "message", wait=1)
    assert 0.9 < took < 3 and not (tmp_path / "message").exists()


def test_a_request_of_an_earlier_run_is_not_the_new_run_s(tmp_path: Path) -> None:
    sp = savepoint()
    (tmp_path / sp.MARKER).touch()
    (tmp_path / sp.REQUEST).touch()
    assert not sp.SaveRequests(str(tmp_path)).asked()


def sp_request() -> str:
    return str(savepoint().REQUEST)


def test_the_save_reported_is_the_job_s_last_saved_said_once() -> None:
    from etoperator.planning import plan_job
    from etoperator.reconcile.launcherlog import said_saved
    from tests.unit.test_planning import inp, jspec, launcher, running_status, w

    stopped = {
        "containerStatuses": [{"state": {"terminated": {"message": "step=42 t=1767268800.5\n"}}}]
    }
    assert said_saved({"status": stopped}) == "step=42 t=1767268800.5"
    assert said_saved({"status": {"containerStatuses": [{"state": {"running": {}}}]}}) == ""
    going = launcher("Failed", deleting=True, saved="step=42 t=1767268800.5")
    plan = plan_job(inp(jspec(), running_status([0, 1]), [w(0), w(1), going]))
    assert plan.status.last_saved == {"step": 42, "time": "2026-01-01T12:00:00Z"}
    assert [e.reason for e in plan.events].count("Saved") == 1
    again = plan_job(inp(jspec(), plan.status, [w(0), w(1), going]))
    assert "Saved" not in [e.reason for e in again.events]


def test_a_save_reported_by_a_launcher_already_gone_reaches_the_status() -> None:
    """Under load the kubelet removed the stopped launcher before any pass saw its last
    status: the report, kept from the pod's deletion, was lost (status.lastSaved empty)."""
    import dataclasses

    from etoperator.planning import plan_job
    from tests.unit.test_planning import inp, jspec, running_status

    gone = dataclasses.replace(
        inp(jspec(), running_status([0, 1]), []), saved="step=7 t=1767268800.0"
    )
    assert plan_job(gone).status.last_saved == {"step": 7, "time": "2026-01-01T12:00:00Z"}


def test_a_save_the_operator_missed_is_said_by_the_next_run_s_launcher() -> None:
    """The operator down from a launcher's delete until its pod was gone: the stop's report
    went with the pod. The next run's launcher finds it on the volume (its init container's
    termination message): the status says it then; an older one changes nothing."""
    import dataclasses

    from etoperator.builders import runtimes
    from etoperator.cache import slim
    from etoperator.planning import plan_job
    from etoperator.reconcile.launcherlog import said_saved
    from tests.unit.test_planning import inp, jspec, launcher, running_status, w

    spec = parse_job(torchrun_job("tr", 2, ["--steps", "5"]))
    pod = runtimes.of(spec).launcher(spec, OWNER, 1, ("tr", frozenset()), 2)[-1]
    init = pod["spec"]["initContainers"][-1]
    assert init["volumeMounts"][0]["mountPath"] == "/checkpoints"
    assert "/checkpoints/.etoperator-saved" in init["command"][-1]
    started = {"initContainerStatuses": [
        {"state": {"terminated": {"exitCode": 0, "message": "step=9 t=1767268800.0"}}}
    ]}  # fmt: skip
    said = said_saved(slim("Pod", {"metadata": {"name": "tr-launcher"}, "status": started}))
    assert said == "step=9 t=1767268800.0"
    new_run = dataclasses.replace(launcher("Running"), saved=said)
    plan = plan_job(inp(jspec(), running_status([0, 1]), [w(0), w(1), new_run]))
    assert plan.status.last_saved == {"step": 9, "time": "2026-01-01T12:00:00Z"}
    later = dict(plan.status.last_saved, time="2026-01-02T00:00:00Z", step=12)
    status = dataclasses.replace(plan.status, last_saved=later)
    assert plan_job(inp(jspec(), status, [w(0), w(1), new_run])).status.last_saved == later


def test_a_stop_keeps_the_host_list_until_the_launcher_is_gone() -> None:
    """The stop published an empty host list with its deletes: Horovod's discovery ended the
    training before the launcher's preStop asked it to save (a Kueue eviction right after a
    shrink lost the steps since the last commit)."""
    import dataclasses

    from etoperator.planning import plan_job
    from tests.unit.test_planning import inp, jspec, launcher, running_status, w

    spec = dataclasses.replace(jspec(), suspended=True)
    pods = [w(0), w(1), launcher()]
    published = ["j-worker-0", "j-worker-1"]
    stop = plan_job(
        dataclasses.replace(inp(spec, running_status([0, 1]), pods), published=published)
    )
    assert stop.delete_pods == ["j-launcher"]  # the workers once it is gone
    assert stop.hosts is None  # Horovod still trains on them: the save comes first
    gone = plan_job(dataclasses.replace(inp(spec, stop.status, [w(0), w(1)]), published=published))
    assert gone.hosts == [] and gone.delete_pods == ["j-worker-0", "j-worker-1"]


STOPPED_MID_SAVE = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from savepoint import write_whole
path = sys.argv[2]

def bytes_(data: bytes):
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data[:4096])
            if data.startswith(b"A"):
                os.kill(os.getpid(), signal.SIGTERM)  # the stop comes mid-save
            f.write(data[4096:])
    return write

def stopped(signum, _frame):  # as the examples: the stop's own save, then exit
    write_whole(path, bytes_(b"B" * 8192))
    sys.exit(128 + signum)

if len(sys.argv) < 4:  # else no handler: the stop's default action, once the save is whole
    signal.signal(signal.SIGTERM, stopped)
write_whole(path, bytes_(b"A" * 8192))
"""


def test_a_stop_that_comes_mid_save_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    """A SIGTERM during a save runs the stop's own save (every example's handler does): the
    checkpoint is then one save whole, never one written into the other's file (seen as a
    checkpoint torch.load could not read, the run failed at its next start)."""
    import sys

    from tests.support.modules import ROOT

    path = tmp_path / "ckpt"
    code = [sys.executable, "-c", STOPPED_MID_SAVE, str(ROOT / "examples"), str(path)]
    done = subprocess.run(code, timeout=30, capture_output=True)
    assert done.returncode == 143, done.stderr
    assert path.read_bytes() in (b"A" * 8192, b"B" * 8192), path.read_bytes()[:32]


def test_a_request_no_stop_follows_pauses_the_run_and_never_hangs_it() -> None:
    t0 = time.monotonic()
    savepoint().hold(0.3)
    assert 0.3 <= time.monotonic() - t0 < 2


def test_a_stop_mid_save_of_a_script_without_a_handler_ends_it_once_the_save_is_whole(
    tmp_path: Path,
) -> None:
    import signal
    import sys

    from tests.support.modules import ROOT

    path = tmp_path / "ckpt"
    code = [sys.executable, "-c", STOPPED_MID_SAVE, str(ROOT / "examples"), str(path), "plain"]
    done = subprocess.run(code, timeout=30, capture_output=True)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert path.read_bytes() == b"A" * 8192
