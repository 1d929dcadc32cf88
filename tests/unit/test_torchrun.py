"""A Torchrun job as parsed and built, and the rendezvous' own edits of torch's state (on
torch's real state class)."""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from etoperator import leave, naming, rendezvous, torchagent
from etoperator.api.fields import InvalidSpec
from etoperator.api.models import parse_job
from etoperator.builders import runtimes
from etoperator.builders import torchrun as tr
from etoperator.builders.common import Owner
from localcluster.manifests import torchrun_job
from localcluster.procs import free_port

OWNER = Owner("TrainingJob", "tr", "uid-1")
RUNS_THAT_END = 6  # one in four hung before (test_every_run_of_a_user_s_script_ends)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun" / "train.py"


def body(**worker: Any) -> dict[str, Any]:
    b = torchrun_job("tr", 2, ["--steps", "5"], minReplicas=1, maxReplicas=4, **worker)
    b["metadata"].update(namespace="ns", uid="uid-1")
    return b


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_a_torchrun_worker_gets_what_only_the_operator_knows() -> None:
    spec = parse_job(body())
    pod = runtimes.of(spec).worker_pod(spec, OWNER, 3, 2, ("tr", frozenset()))
    env = env_of(pod)
    assert env["PET_NNODES"] == "1:4"
    assert env["PET_RDZV_ENDPOINT"] == "tr-launcher:29400"
    assert env["PET_RDZV_ID"] == "uid-1-2"  # the job's uid and its run
    assert env["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["CHECKPOINT_DIR"] == "/checkpoints"  # the user's own stays
    first = pod["spec"]["containers"][0]
    # torchrun's own arguments, run by the rendezvous script's agent (workers forked warm)
    assert first["command"][:2] == ["sh", "-c"] and "/etc/edl/torchagent.py" in first["command"][2]
    assert first["command"][3] == "torchrun"
    hook = first["lifecycle"]["preStop"]["exec"]["command"][-1]
    # a whole stop's leave waits for the save: the handshake's request and report
    request, report = naming.SAVE_REQUEST, naming.SAVE_REPORT
    assert hook.endswith(f"/etc/edl/leave.py /checkpoints/{request} /checkpoints/{report}")
    assert leave.HOLD == torchagent.HOLD  # what the leave sends is what the agent holds at
    assert torchagent.LEAVE == naming.LEAVE_KEY  # the agent asks with its sibling
    assert leave.SAVE_WAIT == naming.SAVE_WAIT  # the worker waits as long as the launcher
    assert pod["spec"]["initContainers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert not any(v.get("secret") for v in pod["spec"]["volumes"])  # no SSH key given
    claim = {"claimName": "tr-shared"}
    assert {"name": "etoperator-shared", "persistentVolumeClaim": claim} in pod["spec"]["volumes"]


def test_a_torchrun_launcher_holds_the_rendezvous_and_has_a_name() -> None:
    spec = parse_job(body())
    made = runtimes.of(spec).launcher(spec, OWNER, 0, ("tr", frozenset()), 2)
    service, pod = made
    assert service["kind"] == "Service" and service["metadata"]["name"] == "tr-launcher"
    argv = pod["spec"]["containers"][0]["command"]
    assert argv[-6:] == ["serve", "29400", "uid-1-0", "1", "/etc/edl/discover_hosts.sh",
                         "/checkpoints/.etoperator-save-request"]  # fmt: skip
    assert pod["spec"]["containers"][0]["image"] == "etoperator/train:latest"  # the worker's
    assert pod["metadata"]["annotations"][naming.ANN_RUN] == "0"
    data = runtimes.of(spec).config_data(spec, ["tr-worker-0"])
    assert data[naming.RENDEZVOUS_KEY].startswith('"""The rendezvous of a torchrun job')
    assert data[naming.LEAVE_KEY].startswith('"""A torchrun worker\'s leave')  # beside it
    # whether its own pod is being deleted (a whole stop): the names it reads are the pod's
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in pod["spec"]["containers"][0]["env"] if "valueFrom" in e}  # fmt: skip
    assert env[rendezvous.POD_ENV] == "metadata.name"
    assert env[rendezvous.NAMESPACE_ENV] == "metadata.namespace"
    assert os.path.basename(rendezvous.SAVES) == naming.SAVE_MARKER  # the script's marker


@pytest.mark.parametrize(
    "change, said",
    [
        (
            lambda c: c.setdefault("env", []).append({"name": "PET_RDZV_ID", "value": "x"}),
            "PET_RDZV",
        ),
        (lambda c: c["command"].insert(1, "--nnodes=2"), "--nnodes"),
        (lambda c: c.pop("command"), "needs a command"),
    ],
)
def test_what_would_break_the_rendezvous_is_refused(change: Any, said: str) -> None:
    b = body()
    change(b["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0])
    with pytest.raises(InvalidSpec, match=said):
        parse_job(b)


def test_horovod_jobs_need_their_launcher_and_no_elastic_policy() -> None:
    b = copy.deepcopy(body())
    b["spec"]["runtime"] = "Horovod"
    with pytest.raises(InvalidSpec, match="launcher"):
        parse_job(b)


def node(addr: str) -> Any:
    return _NodeDesc(addr, 1, 0)


def complete_round(*addrs: str) -> Any:
    state = _RendezvousState()
    now = datetime.now(UTC)
    for rank, addr in enumerate(addrs):
        state.participants[node(addr)] = rank
        state.last_heartbeats[node(addr)] = now
    state.complete = True
    return pickle.loads(pickle.dumps(state))


def test_a_leaving_node_goes_and_the_others_are_told_to_restart() -> None:
    state = complete_round("a", "b", "c")
    assert rendezvous.drop_nodes(state, "c")
    assert {n.addr for n in state.participants} == {"a", "b"}
    assert rendezvous.marker() in state.wait_list  # torch's "nodes waiting" is 1
    assert not rendezvous.drop_nodes(state, "c")  # asked twice: nothing more


def test_the_last_node_leaving_moves_the_round_on_without_a_marker() -> None:
    state = complete_round("a")
    rendezvous.drop_nodes(state, "a")
    assert state.round == 1 and not state.complete and not state.wait_list


def test_the_marker_goes_once_its_round_moved_on() -> None:
    state = complete_round("a", "b")
    rendezvous.drop_nodes(state, "b")
    marked = state.round
    assert rendezvous.tidy(state, marked, lambda: 1, 1) == (False, True)
    state.round, state.complete = marked + 1, False
    changed, out = rendezvous.tidy(state, marked, lambda: 1, 1)
    assert changed and not out and rendezvous.marker() not in state.wait_list


def test_a_forming_round_closes_once_it_holds_the_host_list() -> None:
    state = _RendezvousState()
    later = datetime.now(UTC) + timedelta(seconds=30)  # torch's last call
    state.participants = {node("a"): 0, node("b"): 0}
    state.deadline = later
    assert rendezvous.tidy(state, None, lambda: 3, 1) == (False, False)  # 2 of 3: torch waits
    changed, _ = rendezvous.tidy(state, None, lambda: 2, 1)
    assert changed and state.deadline < datetime.now(UTC)


def test_torchrun_as_it_is_gets_torchs_timeouts_no_hook_and_a_store_alone() -> None:
    b = body()
    b["metadata"]["annotations"] = {naming.ANN_TORCHRUN_PLAIN: "true"}
    spec = parse_job(b)
    pod = runtimes.of(spec).worker_pod(spec, OWNER, 0, 0, ("tr", frozenset()))
    assert env_of(pod)["PET_RDZV_CONF"] == "is_host=false"  # torch's keep-alive and last call
    assert "lifecycle" not in pod["spec"]["containers"][0]
    _, launcher = runtimes.of(spec).launcher(spec, OWNER, 0, ("tr", frozenset()), 2)
    assert launcher["spec"]["containers"][0]["command"][-1] == "-"


def test_the_rendezvous_host_stops_at_sigterm_as_a_container_s_first_process() -> None:
    """A container's first process gets no default signal action: the launcher must end at
    the kubelet's SIGTERM itself, not wait out the grace period for its SIGKILL."""
    import shutil

    if not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a PID namespace")
    port = free_port()
    argv = [sys.executable, "-u", rendezvous.__file__, "serve", str(port), "r", "1", "-"]
    # unshare forks the server as PID 1 of a new PID namespace; its parent passes signals on
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *argv],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "serving" in proc.stdout.readline()
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        server = int(children.stdout.split()[0])
        os.kill(server, signal.SIGTERM)
        # Well short of a pod's 30 s grace period; its exit (torch loaded) took over 5 s on a
        # machine running the suite beside it.
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is not None, "the rendezvous host ignored SIGTERM"
    finally:
        proc.kill()
        proc.wait()


WORKER = """
import sys
# before this script imported anything: torch, and what any optimizer's construction imports
warm = "torch" in sys.modules and "torch._dynamo" in sys.modules
import os
import helper  # beside the script, as `python script.py` finds it
import torch
rank = os.environ["RANK"]
with open(os.path.join(sys.argv[1], rank), "w") as f:
    print(__name__, warm, helper.WORD, torch.get_num_threads(), *sys.argv[2:], file=f)
sys.exit(int(sys.argv[2]))
"""


def run_agent(tmp_path: Path, code: int, *options: str) -> tuple[int, dict[str, str]]:
    (tmp_path / "script.py").write_text(WORKER)
    (tmp_path / "helper.py").write_text("WORD = 'found'\n")
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, torchagent.__file__, "--standalone", "--nproc-per-node=2",
            *options, str(tmp_path / "script.py"), str(out), str(code), "x y"]  # fmt: skip
    ours = ("PET_", "OMP_NUM_THREADS")  # torchrun's flags, and what it sets for 2 processes
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env["TMPDIR"] = str(tmp_path)  # its leave watcher's files: the test's, not the host's
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, {p.name: p.read_text().strip() for p in out.iterdir()}


def test_the_agent_runs_the_script_in_workers_forked_with_torch_imported(tmp_path: Path) -> None:
    """What a restart at every membership change saves: a Python, torch's import and the
    compiler stack's that any optimizer's construction imports (1.1-1.7 s a process)."""
    code, said = run_agent(tmp_path, 0)
    assert code == 0 and said == dict.fromkeys(("0", "1"), "__main__ True found 1 0 x y")


def test_a_worker_s_failure_is_the_agent_s(tmp_path: Path) -> None:
    """The first worker to fail ends the other (torch's agent stops the group), perhaps
    before it wrote: each that wrote ran the script, and the agent's exit is a failure."""
    code, said = run_agent(tmp_path, 3)
    assert code != 0 and said, said
    assert set(said.values()) == {"__main__ True found 1 3 x y"}, said


def test_a_start_method_asked_for_is_torchrun_s_as_it_is(tmp_path: Path) -> None:
    code, said = run_agent(tmp_path, 0, "--start-method=spawn")
    assert code == 0 and said["0"] == "__main__ False found 1 0 x y"


def test_a_leave_watcher_with_no_temporary_directory_to_write_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A /tmp the agent cannot write (read-only, gone): the watcher ends at once, marking
    nothing (the hook, finding no `.ready`, asks itself); it raised into the agent's log."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    leave.answer_leaves()
    assert not leave.hand_over(os.getpid(), "launcher:29400")


def test_a_leave_watcher_asks_only_once_the_hook_wrote_the_whole_endpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The hook's hand-over file exists, empty, before its endpoint is written: the watcher
    read it then and answered "ValueError: invalid literal for int()" (a leave in a whole
    stop, in CI, said the launcher did not answer). It asks the endpoint once it is whole."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    port = free_port()  # a port nothing listens on: "the launcher is gone"
    monkeypatch.setenv("PET_LOCAL_ADDR", "127.0.0.2")
    watcher = threading.Thread(target=leave.answer_leaves, daemon=True)
    watcher.start()
    path = Path(leave.asking(os.getpid()))
    deadline = time.monotonic() + 10
    while not Path(f"{path}.ready").exists():
        assert time.monotonic() < deadline, "the watcher never got ready"
        time.sleep(0.01)
    with open(path, "w") as f:  # opened, its endpoint not written yet
        f.flush()
        time.sleep(3 * rendezvous.TICK)
        f.write(f"127.0.0.1:{port}")
    watcher.join(10)
    answer = Path(f"{path}.answer").read_text()
    assert answer.startswith("ok nothing to leave: the launcher is gone"), answer


def test_every_run_of_a_user_s_script_ends(tmp_path: Path) -> None:
    """A user's script as the example, but that lets its DDP model go at `main()`'s return
    (as most do: the example keeps its own for the process's life, LIVES_WITH_THE_PROCESS),
    run as a job runs it (two nodes of one process each, our agent and rendezvous), ends,
    each run of it. Torch's teardown of the model after destroy_process_group (the reducer,
    then gloo's process group, which holds the GIL while it waits for gloo's threads, one of
    which may still need the GIL to release the last step's work) hung 8 runs of 30 here: a
    job Running for ever after its last step, its finished node's agent in the exit barrier.
    The agent holds every process group its workers destroy until they end."""
    script = users_script(tmp_path)
    with ThreadPoolExecutor(2) as pool:  # two at a time: a loaded machine widens the race
        runs = range(RUNS_THAT_END)
        ends = list(pool.map(lambda n: a_run_ends(tmp_path / str(n), n, script), runs))
    hung = [n for n, end in enumerate(ends) if not end]
    assert not hung, f"runs {hung} of {RUNS_THAT_END} never ended"


def users_script(d: Path) -> Path:
    """The example, its model no longer kept: freed as `main()` returns."""
    text = EXAMPLE.read_text()
    keep = "    LIVES_WITH_THE_PROCESS.append(ddp)\n"
    assert keep in text
    script = d / "torchrun" / "users_train.py"
    script.parent.mkdir()
    script.write_text(text.replace(keep, ""))
    (d / "savepoint.py").write_text((EXAMPLE.parent.parent / "savepoint.py").read_text())
    return script


def a_run_ends(d: Path, n: int, script: Path) -> bool:
    d.mkdir()
    discover = d / "discover"
    discover.write_text("#!/bin/sh\necho a\necho b\n")
    discover.chmod(0o755)
    port = free_port()
    run_id = tr.run_id(parse_job(body()), n)
    serve = [sys.executable, rendezvous.__file__, "serve", str(port), run_id, "1", str(discover)]
    procs = [subprocess.Popen(serve, stdout=subprocess.PIPE, text=True, start_new_session=True)]
    try:
        assert procs[0].stdout is not None and "serving" in procs[0].stdout.readline()
        argv = [sys.executable, torchagent.__file__, str(script), "--steps=20",
                f"--checkpoints={d}"]  # fmt: skip
        for addr in ("127.0.0.2", "127.0.0.3"):
            procs.append(subprocess.Popen(argv, env=node_env(d, port, n, addr), text=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + 60
        return all(ended(p, deadline) for p in procs[1:])
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def node_env(d: Path, port: int, n: int, addr: str) -> dict[str, str]:
    """What a worker pod's agent is given (agent_env, run `n`), for a node at `addr` with the
    rendezvous on this machine's `port`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "OMP_NUM_THREADS"))}
    pod = {e["name"]: e["value"] for e in tr.agent_env(parse_job(body()), n) if "value" in e}
    pod.update(PET_RDZV_ENDPOINT=f"127.0.0.1:{port}", PET_LOCAL_ADDR=addr, TMPDIR=str(d))
    return {**env, **pod}


def ended(proc: subprocess.Popen[str], deadline: float) -> bool:
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0
    except subprocess.TimeoutExpired:
        return False
