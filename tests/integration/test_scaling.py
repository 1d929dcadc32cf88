"""ScaleOut, ScaleIn and `kubectl scale` against the real operator process."""

from __future__ import annotations

import base64
import io
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from etoperator.sshcheck import SSHProber
from localcluster.manifests import EXIT_AT_START, REFUSE_KEY, job, scalein, scaleout
from localcluster.world import Timeout
from tests.harness import Cluster, wait_for
from tests.support.horovod import horovod_process
from tests.support.waits import running, settled

pytestmark = pytest.mark.integration
SO, SI = "ScaleOut", "ScaleIn"


def test_scale_out_by_count(cluster: Cluster, ns: str) -> None:
    cluster.create(job("so", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "so")
    cluster.create(scaleout("grow", "so", 2), ns)
    st = settled(cluster, ns, SO, "grow", "ScaleSucceeded")
    assert st["addPods"] == ["so-worker-2", "so-worker-3"]
    assert cluster.hosts(ns, "so") == [f"so-worker-{i}" for i in range(4)]
    # The scaler's status is written first, then the job's, then its spec replicas.
    wait_for(lambda: cluster.status(ns, "so").get("currentScaler") == "", 5, "the job told")
    assert cluster.status(ns, "so")["currentWorkers"] == cluster.hosts(ns, "so")
    wait_for(lambda: spec_replicas(cluster, ns, "so") == 4, 5, "spec replicas at the new size")
    # The finished scale is told on the job as well as on the scaler.
    wait_for(lambda: any(
        e["reason"] == "ScaleSucceeded" and "ScaleOut grow" in e["message"]
        for e in cluster.events(ns, "so")
    ), 5, "a ScaleSucceeded event on the job")  # fmt: skip
    owner = cluster.obj(SO, ns, "grow")["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "TrainingJob" and owner["name"] == "so" and owner["controller"]
    out = cluster.kubectl("get", "scaleout", "-n", ns).stdout.splitlines()
    assert out[1].split()[:5] == [
        "grow",
        "ScaleSucceeded",
        "so",
        "2",
        '["so-worker-2","so-worker-3"]',
    ]


def test_scale_out_beyond_max_is_refused(cluster: Cluster, ns: str) -> None:
    cluster.create(job("cap", replicas=2, maxReplicas=3), ns)
    running(cluster, ns, "cap")
    cluster.create(scaleout("toomany", "cap", 2), ns)
    settled(cluster, ns, SO, "toomany", "ScaleFailed")
    cond = cluster.condition(ns, "toomany", "ScaleFailed", SO)
    assert cond and "exceed maxReplicas 3" in cond["message"]
    assert cluster.pods(ns, "cap", "worker") == ["cap-worker-0", "cap-worker-1"]
    assert "maxReplicas" in cluster.wait_event(ns, "toomany", etype="Warning")["message"]


def test_scale_out_timeout_rolls_back(cluster: Cluster, ns: str) -> None:
    cluster.create(job("slow", replicas=2), ns)
    running(cluster, ns, "slow")
    cluster.hold()  # never becomes ready
    cluster.create(scaleout("late", "slow", 1, timeout=2), ns)
    settled(cluster, ns, SO, "late", "ScaleFailed", 15)
    cond = cluster.condition(ns, "late", "ScaleFailed", SO)
    assert cond and "not ready within 2s" in cond["message"]
    wait_for(
        lambda: cluster.pods(ns, "slow", "worker") == ["slow-worker-0", "slow-worker-1"],
        10,
        "the new worker removed",
    )
    assert cluster.hosts(ns, "slow") == ["slow-worker-0", "slow-worker-1"]
    assert cluster.job(ns, "slow")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 2
    assert cluster.phase(ns, "slow") == "Running"


def test_scale_in_by_count_takes_highest_index(cluster: Cluster, ns: str) -> None:
    cluster.create(job("si", replicas=3), ns)
    running(cluster, ns, "si", 3)
    cluster.create(scalein("shrink", "si", count=1), ns)
    st = settled(cluster, ns, SI, "shrink", "ScaleSucceeded")
    assert st["toDeletePods"] == ["si-worker-2"]
    assert cluster.hosts(ns, "si") == ["si-worker-0", "si-worker-1"]
    wait_for(lambda: cluster.pods(ns, "si", "worker") == ["si-worker-0", "si-worker-1"], 10)
    wait_for(lambda: cluster.api.get("Service", ns, "si-worker-2") is None, 10)
    assert cluster.job(ns, "si")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 2


def test_scale_in_unknown_names_deletes_nothing(cluster: Cluster, ns: str) -> None:
    cluster.create(job("names", replicas=2), ns)
    running(cluster, ns, "names")
    cluster.create(scalein("typo", "names", pod_names=["names-worker-7"]), ns)
    settled(cluster, ns, SI, "typo", "ScaleFailed")
    cond = cluster.condition(ns, "typo", "ScaleFailed", SI)
    assert cond and "names-worker-7" in cond["message"] and "nothing deleted" in cond["message"]
    assert cluster.pods(ns, "names", "worker") == ["names-worker-0", "names-worker-1"]
    assert cluster.hosts(ns, "names") == ["names-worker-0", "names-worker-1"]
    # `kubectl get si -o wide` says which job and why it failed.
    row = cluster.kubectl("get", "si", "typo", "-n", ns, "-o", "wide").stdout.splitlines()
    assert row[0].split()[:5] == ["NAME", "PHASE", "JOB", "COUNT", "PODS"], row[0]
    assert "REASON" in row[0] and "names-worker-7" in row[1] and "nothing deleted" in row[1]
    failed = wait_for(
        lambda: [e for e in cluster.events(ns, "names") if "ScaleIn typo" in e["message"]],
        5,
        "the failed scale told on the job",
    )
    assert failed[0]["type"] == "Warning"


def test_scale_in_empty_pod_names_is_rejected(cluster: Cluster, ns: str) -> None:
    for to_delete, needle in (
        ({"podNames": []}, "podNames"),
        ({}, "exactly one of count and podNames"),
        ({"count": 1, "podNames": ["x"]}, "exactly one"),
    ):
        manifest = scalein("empty", "any")
        manifest["spec"]["toDelete"] = to_delete
        res = cluster.kubectl_create(ns, manifest)
        assert res.returncode != 0 and needle in res.stderr, res.stderr


def test_scale_in_below_min_is_refused(cluster: Cluster, ns: str) -> None:
    cluster.create(job("floor", replicas=2, minReplicas=2), ns)
    running(cluster, ns, "floor")
    cluster.create(scalein("under", "floor", count=1), ns)
    settled(cluster, ns, SI, "under", "ScaleFailed")
    cond = cluster.condition(ns, "under", "ScaleFailed", SI)
    assert cond and "below minReplicas 2" in cond["message"]
    assert cluster.pods(ns, "floor", "worker") == ["floor-worker-0", "floor-worker-1"]


def test_scale_in_drains_exact_victim_only(cluster: Cluster, ns: str) -> None:
    """worker-1 vs worker-10: only a process of the exact victim keeps it busy."""
    cluster.create(job("dr", replicas=11, minReplicas=1), ns)
    running(cluster, ns, "dr", 11)
    with horovod_process(cluster, ns, "dr", "dr-worker-1", "dr-worker-10"):
        # A process of worker-10 must not hold worker-1.
        cluster.create(scalein("one", "dr", pod_names=["dr-worker-1"], timeout=30), ns)
        settled(cluster, ns, SI, "one", "ScaleSucceeded", 15)
    assert "dr-worker-1" not in cluster.hosts(ns, "dr")
    with horovod_process(cluster, ns, "dr", "dr-worker-2", "dr-worker-2"):
        cluster.create(scalein("two", "dr", pod_names=["dr-worker-2"], timeout=60), ns)
        wait_for(lambda: "dr-worker-2" not in cluster.hosts(ns, "dr"), 10, "out of host list")
        # Still busy: the scaler waits, the pod stays.
        wait_for(lambda: cluster.condition(ns, "two", "Scaling", SI), 5)
        assert cluster.phase(ns, "two", SI) == "Scaling"
        assert "dr-worker-2" in cluster.pods(ns, "dr", "worker")
    # The process is gone: the victim is deleted and the scaler succeeds.
    settled(cluster, ns, SI, "two", "ScaleSucceeded", 15)
    wait_for(lambda: "dr-worker-2" not in cluster.pods(ns, "dr", "worker"), 10)


def test_drained_workers_leave_the_host_list_before_they_are_stopped(
    cluster: Cluster, ns: str
) -> None:
    """`kubectl drain` (an eviction, as node upgrades and spot reclaims make): the worker
    leaves the host list first, and its processes stop only once Horovod has let go of it
    (here the test ends the Horovod process once the worker is out of the list, as Horovod's
    driver does at its next reset). The drained node's worker had been killed within 0.4 s,
    before it left the list."""
    cluster.create(job("dn", replicas=2, minReplicas=1), ns)
    running(cluster, ns, "dn")
    node = cluster.obj("Pod", ns, "dn-worker-1")["spec"]["nodeName"]
    with horovod_process(cluster, ns, "dn", "dn-worker-1", "dn-worker-1"):
        drain = subprocess.Popen(
            [str(cluster.cp.kubectl_path()), "--kubeconfig", str(cluster.kubeconfig),
             "drain", node, "--pod-selector=training-job-name=dn,replica-index=1",
             "--ignore-daemonsets", "--timeout=60s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: "dn-worker-1" not in cluster.hosts(ns, "dn"), 10, "out of the list")
            left = cluster.obj("Pod", ns, "dn-worker-1")
            assert left["metadata"].get("deletionTimestamp"), "evicted"
            # Horovod has not let go: its process runs on, and so does the worker.
            alive = cluster.exec(ns, "dn-worker-1", "pgrep", "-f", "etoperator-test-", check=False)
            assert alive.returncode == 0, "the worker was stopped before Horovod let go of it"
        except BaseException:
            drain.kill()
            raise
    wait_for(lambda: "dn-worker-1" not in cluster.pods(ns, "dn", "worker"), 20, "stopped")
    out, _ = drain.communicate(timeout=60)
    assert drain.returncode == 0, out
    assert cluster.hosts(ns, "dn") == ["dn-worker-0"] and cluster.phase(ns, "dn") == "Running"
    notice = cluster.condition(ns, "dn", "WorkerPreempted") or {}
    assert "left the host list before being stopped" in str(notice.get("message")), notice


def test_a_new_worker_is_listed_only_once_its_name_resolves(cluster: Cluster, ns: str) -> None:
    """Horovod reaches workers by name: a worker listed while cluster DNS does not know it yet
    (after an apiserver restart CoreDNS lagged) failed Horovod's ssh and the job with it."""
    cluster.create(job("dnsj", replicas=1, maxReplicas=3), ns)
    running(cluster, ns, "dnsj", 1)
    assert cluster.local.real is not None and cluster.local.real.dns is not None
    with cluster.local.real.dns.held():
        cluster.create(scaleout("grow", "dnsj", 1, timeout=120), ns)
        ip = wait_for(lambda: cluster.ip(ns, "dnsj-worker-1"), 30, "the new worker running")
        key = paramiko.Ed25519Key.from_private_key(
            io.StringIO(
                base64.b64decode(cluster.obj("Secret", ns, "dnsj")["data"]["id_rsa"]).decode()
            )
        )
        prober = SSHProber(port=cluster.ssh_port)
        wait_for(lambda: prober.ready(str(ip), key), 30, "its sshd taking the job's key")

        def says_why() -> bool:
            cond = cluster.condition(ns, "grow", "Scaling", "ScaleOut") or {}
            return "resolve" in str(cond.get("message"))

        wait_for(says_why, 15, "the ScaleOut saying it waits for the name")
        assert cluster.hosts(ns, "dnsj") == ["dnsj-worker-0"], "listed before DNS knew it"
    settled(cluster, ns, SO, "grow", "ScaleSucceeded", 30)
    assert cluster.hosts(ns, "dnsj") == ["dnsj-worker-0", "dnsj-worker-1"]


def test_scale_in_drain_timeout_deletes_anyway(cluster: Cluster, ns: str) -> None:
    cluster.create(job("stuck", replicas=2), ns)
    running(cluster, ns, "stuck")
    with horovod_process(cluster, ns, "stuck", "stuck-worker-1", "stuck-worker-1"):
        cluster.create(scalein("force", "stuck", count=1, timeout=2), ns)
        settled(cluster, ns, SI, "force", "ScaleSucceeded", 15)
        cond = cluster.condition(ns, "force", "DrainTimeout", SI)
        assert cond and "deleted anyway" in cond["message"]
        wait_for(lambda: cluster.pods(ns, "stuck", "worker") == ["stuck-worker-0"], 10)


def test_scalers_run_oldest_first_one_at_a_time(cluster: Cluster, ns: str) -> None:
    cluster.create(job("q", replicas=2, maxReplicas=5), ns)
    running(cluster, ns, "q")
    cluster.hold()
    cluster.create(scaleout("a-first", "q", 1, timeout=30), ns)
    wait_for(lambda: cluster.phase(ns, "a-first", SO) == "Scaling", 10)
    cluster.create(scalein("b-second", "q", count=1), ns)
    # b-second waits while a-first runs.
    wait_for(lambda: cluster.status(ns, "q").get("currentScaler") == f"ScaleOut:{ns}/a-first")
    assert cluster.phase(ns, "b-second", SI) == ""
    cluster.release()
    settled(cluster, ns, SO, "a-first", "ScaleSucceeded")
    st = settled(cluster, ns, SI, "b-second", "ScaleSucceeded")
    # Run after the ScaleOut, the ScaleIn by count removes the newest worker.
    assert st["toDeletePods"] == ["q-worker-2"]
    assert cluster.hosts(ns, "q") == ["q-worker-0", "q-worker-1"]


def test_scaler_created_before_its_job(cluster: Cluster, ns: str) -> None:
    cluster.create(scaleout("early", "later", 1), ns)
    wait_for(lambda: cluster.condition(ns, "early", "Waiting", SO), 10, "Waiting condition")
    assert (cluster.condition(ns, "early", "Waiting", SO) or {})["reason"] == "JobNotFound"
    assert cluster.phase(ns, "early", SO) == ""
    cluster.create(job("later", replicas=1), ns)
    settled(cluster, ns, SO, "early", "ScaleSucceeded", 30)
    assert cluster.hosts(ns, "later") == ["later-worker-0", "later-worker-1"]


def test_job_finishing_mid_scale_fails_the_scaler(cluster: Cluster, ns: str) -> None:
    cluster.create(job("fin", replicas=1), ns)
    running(cluster, ns, "fin", 1)
    cluster.hold()
    cluster.create(scaleout("never", "fin", 1, timeout=60), ns)
    wait_for(lambda: cluster.phase(ns, "never", SO) == "Scaling", 10)
    cluster.finish(ns, "fin-launcher", 0)
    settled(cluster, ns, SO, "never", "ScaleFailed")
    assert (cluster.condition(ns, "never", "ScaleFailed", SO) or {})["reason"] == "JobFinished"


def test_job_deleted_mid_scale_takes_its_scalers(cluster: Cluster, ns: str) -> None:
    cluster.create(job("gone", replicas=1), ns)
    running(cluster, ns, "gone", 1)
    cluster.hold()
    cluster.create(scaleout("orphan", "gone", 1, timeout=60), ns)
    wait_for(lambda: cluster.phase(ns, "orphan", SO) == "Scaling", 10)
    cluster.api.delete("TrainingJob", ns, "gone")
    wait_for(lambda: cluster.api.get(SO, ns, "orphan") is None, 10, "scaler collected")
    wait_for(lambda: cluster.pods(ns, "gone", live=False) == [], 10)


def test_operator_killed_after_plan_frozen(cluster: Cluster, ns: str) -> None:
    cluster.create(job("frz", replicas=2, maxReplicas=6), ns)
    running(cluster, ns, "frz")
    cluster.hold()
    cluster.create(scaleout("once", "frz", 1, timeout=60), ns)
    wait_for(
        lambda: (
            cluster.status(ns, "once", SO).get("addPods") == ["frz-worker-2"]
            and cluster.status(ns, "frz").get("currentScaler")
        ),
        10,
        "plan frozen",
    )
    cluster.operator.kill()
    cluster.release()
    cluster.operator.start()
    st = settled(cluster, ns, SO, "once", "ScaleSucceeded")
    assert st["addPods"] == ["frz-worker-2"]
    assert cluster.pods(ns, "frz", "worker") == ["frz-worker-0", "frz-worker-1", "frz-worker-2"]
    # ScaleIn, killed after victims were chosen: exactly those go, nothing more.
    with horovod_process(cluster, ns, "frz", "frz-worker-1", "frz-worker-1"):
        cluster.create(scalein("cut", "frz", pod_names=["frz-worker-1"], timeout=60), ns)
        wait_for(lambda: cluster.status(ns, "cut", SI).get("toDeletePods"), 10)
        cluster.operator.kill()
        cluster.operator.start()
    settled(cluster, ns, SI, "cut", "ScaleSucceeded")
    wait_for(lambda: cluster.pods(ns, "frz", "worker") == ["frz-worker-0", "frz-worker-2"], 10)
    assert cluster.hosts(ns, "frz") == ["frz-worker-0", "frz-worker-2"]


def test_kubectl_scale_up_and_down(cluster: Cluster, ns: str) -> None:
    cluster.create(job("ks", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "ks")
    cluster.kubectl("scale", "trainingjob", "ks", "-n", ns, "--replicas", "3")
    wait_for(
        lambda: cluster.hosts(ns, "ks") == ["ks-worker-0", "ks-worker-1", "ks-worker-2"],
        20,
        "scaled to 3",
    )
    outs = [s for s in cluster.api.list(SO, ns) if s["metadata"]["name"].startswith("ks-")]
    assert len(outs) == 1
    settled(cluster, ns, SO, outs[0]["metadata"]["name"], "ScaleSucceeded")
    cluster.kubectl("scale", "trainingjob", "ks", "-n", ns, "--replicas", "1")
    wait_for(lambda: cluster.hosts(ns, "ks") == ["ks-worker-0"], 20, "scaled to 1")
    ins = cluster.api.list(SI, ns)
    assert len(ins) == 1 and ins[0]["status"]["toDeletePods"] == ["ks-worker-1", "ks-worker-2"]
    wait_for(lambda: cluster.phase(ns, ins[0]["metadata"]["name"], SI) == "ScaleSucceeded")
    wait_for(lambda: cluster.phase(ns, "ks") == "Running")
    # Beyond maxReplicas, the API server refuses the scale.
    res = cluster.kubectl("scale", "trainingjob", "ks", "-n", ns, "--replicas", "9", check=False)
    assert res.returncode != 0 and "maxReplicas" in res.stderr
    out = cluster.kubectl("get", "tj", "ks", "-n", ns).stdout.split()
    assert out[5:9] == ["ks", "Running", "1", "1"], out


def test_scaler_script_runs_on_the_launcher_with_values_as_given(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    out = tmp_path / "hook.out"
    hook = tmp_path / "hook.sh"
    # Written for the Go operator: run by `sh`, so it needs no shebang or exec bit, and gets
    # the scaler's pods as one argument `pod1:slots,pod2:slots`.
    hook.write_text(f'printf "%s\\n" "$GREETING" "$@" > {out}\n')
    hook.chmod(0o644)
    cluster.create(job("hook", replicas=1, maxReplicas=3, shared=tmp_path), ns)
    running(cluster, ns, "hook", 1)
    manifest = scaleout("hooked", "hook", 2)
    tricky = "it's $(touch /tmp/etoperator-pwned) `id` ; rm -rf /"
    manifest["spec"].update(script=str(hook), env=[{"name": "GREETING", "value": tricky}])
    cluster.create(manifest, ns)
    settled(cluster, ns, SO, "hooked", "ScaleSucceeded", 60)  # two workers: 12 s of 20 once
    # The script ran once, with the scaler's own pods as one argument and the value verbatim.
    assert out.read_text().splitlines() == [tricky, "hook-worker-1:1,hook-worker-2:1"]
    cond = cluster.condition(ns, "hooked", "ScriptExecuted", SO)
    assert cond and cond["status"] == "True" and "exited 0" in cond["message"]
    pwned = cluster.exec(ns, "hook-launcher", "test", "-e", "/tmp/etoperator-pwned", check=False)
    assert pwned.returncode == 1


def test_a_scaler_script_runs_once_per_scale(cluster: Cluster, ns: str, tmp_path: Path) -> None:
    """Each scaler's script runs once: not again when the pass after it still sees the scaler
    without its ScriptExecuted condition (the cache behind the script's report)."""
    out = tmp_path / "runs"
    hook = tmp_path / "count.sh"
    hook.write_text(f'echo "$1" >> {out}\n')
    cluster.create(job("once", replicas=4, minReplicas=1, shared=tmp_path), ns)
    running(cluster, ns, "once", 4)
    names = [f"once-in-{i}" for i in range(3)]
    for name in names:
        manifest = scalein(name, "once", count=1)
        manifest["spec"]["script"] = str(hook)
        cluster.create(manifest, ns)
        settled(cluster, ns, SI, name, "ScaleSucceeded")

    def runs() -> list[str]:
        return out.read_text().splitlines() if out.exists() else []

    # A second run would come within a pass or two of the report; none may come at all.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert len(runs()) <= 3, runs()
        time.sleep(0.1)
    assert sorted(runs()) == ["once-worker-1:1", "once-worker-2:1", "once-worker-3:1"]
    for name in names:
        events = [e for e in cluster.events(ns, name) if e["reason"] == "ScriptSucceeded"]
        assert len(events) == 1 and events[0].get("count", 1) == 1, events


def test_hanging_scripts_of_some_jobs_hold_up_no_other_jobs_script(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """Nine jobs whose scaler scripts hang (more than the eight a shared pool once held): a
    tenth job's scripted scale still runs its script and succeeds."""
    gate = tmp_path / "gate"
    hang = tmp_path / "hang.sh"
    # A second between looks: nine of these on the suite's loaded nodes cost little.
    hang.write_text(f"while [ ! -e {gate} ]; do sleep 1; done\n")
    quick = tmp_path / "quick.sh"
    quick.write_text(f"echo done > {tmp_path / 'quick.out'}\n")
    names = [f"hang{i}" for i in range(9)]
    try:
        for name in [*names, "free"]:
            cluster.create(job(name, replicas=1, maxReplicas=2, shared=tmp_path), ns)
        for name in [*names, "free"]:
            running(cluster, ns, name, 1)
        for name in names:
            manifest = scaleout(f"{name}-grow", name, 1, timeout=300)
            manifest["spec"]["script"] = str(hang)
            cluster.create(manifest, ns)
        # Nine workers start, join and are probed at once on the suite's loaded nodes: the
        # wait is for all of that, well inside the scales' own timeout.
        try:
            wait_for(lambda: not scripts_not_running(cluster, ns, names), 120, "nine scripts")
        except Timeout:
            pytest.fail(
                f"scripts not running after 120s: {scripts_not_running(cluster, ns, names)}"
            )
        manifest = scaleout("free-grow", "free", 1)
        manifest["spec"]["script"] = str(quick)
        cluster.create(manifest, ns)
        # Its worker starts and is probed beside the nine hanging scales' on loaded nodes (over
        # 30 s once, its passes' views 1-2.5 s each): the point is that it ends, not how soon.
        try:
            settled(cluster, ns, SO, "free-grow", "ScaleSucceeded", timeout=90)
        except Timeout as exc:
            raise Timeout(f"{exc}\n{cluster.describe(ns, 'free')}") from None
        cond = cluster.condition(ns, "free-grow", "ScriptExecuted", SO)
        assert cond and cond["status"] == "True", cond
        assert all(cluster.phase(ns, f"{n}-grow", SO) == "Scaling" for n in names)
    finally:
        gate.touch()


def scripts_not_running(cluster: Cluster, ns: str, jobs: list[str]) -> dict[str, str]:
    """The jobs whose scale-out's script is not running yet, with what their scale waits for."""
    left = {}
    for n in jobs:
        if (cluster.condition(ns, f"{n}-grow", "ScriptExecuted", SO) or {}).get("status") != (
            "Unknown"
        ):
            scaling = cluster.condition(ns, f"{n}-grow", "Scaling", SO) or {}
            left[n] = str(scaling.get("message") or cluster.phase(ns, f"{n}-grow", SO))
    return left


def test_a_script_cut_off_by_an_operator_restart_runs_once_and_ends_its_scale_at_once(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """The operator is killed while a script runs (its exec stream, and with it the outcome,
    is lost): the new operator learns the outcome from the launcher, where the script's end
    is recorded, so the script runs once and its scaler ends within seconds of it (it had
    waited out the script's timeout, then run it a second time)."""
    log = tmp_path / "runs"
    hook = tmp_path / "slow.sh"
    hook.write_text(f"echo start >> {log}; sleep 4; echo end >> {log}; exit 3\n")
    cluster.create(job("twice", replicas=1, maxReplicas=2, shared=tmp_path), ns)
    running(cluster, ns, "twice", 1)
    manifest = scaleout("grow", "twice", 1, timeout=120)
    manifest["spec"]["script"] = str(hook)
    cluster.create(manifest, ns)
    wait_for(lambda: log.exists() and "start" in log.read_text(), 30, "the script started")
    cluster.operator.kill()
    cluster.operator.start()
    wait_for(lambda: "end" in log.read_text(), 30, "the script ended")
    ended = time.monotonic()
    settled(cluster, ns, SO, "grow", "ScaleSucceeded", timeout=60)
    # Well before the script's 120 s timeout (the defect), however slow the new operator's start.
    assert time.monotonic() - ended < 60, "the scale waited out the script's timeout"
    assert log.read_text().split() == ["start", "end"], "the script ran again"
    cond = cluster.condition(ns, "grow", "ScriptExecuted", SO)
    assert cond and cond["status"] == "False" and "exited 3" in cond["message"], cond


def test_failing_scaler_script_is_reported(cluster: Cluster, ns: str) -> None:
    cluster.create(job("hookfail", replicas=2), ns)
    running(cluster, ns, "hookfail")
    manifest = scalein("badhook", "hookfail", count=1)
    manifest["spec"]["script"] = "/bin/false"
    cluster.create(manifest, ns)
    settled(cluster, ns, SI, "badhook", "ScaleSucceeded")
    cond = cluster.condition(ns, "badhook", "ScriptExecuted", SI)
    assert cond and cond["status"] == "False" and cond["reason"] == "ScriptFailed"
    cluster.wait_event(ns, "badhook", "ScriptFailed")


@pytest.mark.faults
def test_a_scaler_script_that_cannot_start_says_why(cluster: Cluster, ns: str) -> None:
    """An exec refused before it ran was told as "script exited -1". Here its URL is too long
    for the server in front of the apiserver (the fault proxy's 8 KB request line, as a load
    balancer's may be; the apiserver itself takes up to 1 MB)."""
    cluster.create(job("hooknorun", replicas=2), ns)
    running(cluster, ns, "hooknorun")
    manifest = scalein("bigenv", "hooknorun", count=1)
    manifest["spec"].update(script="/bin/true", env=[{"name": "BIG", "value": "x" * 30_000}])
    cluster.create(manifest, ns)
    settled(cluster, ns, SI, "bigenv", "ScaleSucceeded")
    cond = wait_for(lambda: cluster.condition(ns, "bigenv", "ScriptExecuted", SI), 20, "told")
    assert cond is not None and cond["status"] == "False", cond
    assert "did not run" in cond["message"], cond
    why = cond["message"].split(": ", 1)[-1]  # the refusal, in the words of whoever refused
    # The server in front answers 400 and closes; the operator, still sending, may instead see
    # the connection closed under it (twice: it tries once more when nothing answered).
    said = ("400 Bad Request", "414", "too long", "no answer from the apiserver")
    assert any(w in why for w in said), cond


@pytest.mark.faults
def test_a_scaler_script_whose_exec_got_no_answer_runs_once_more(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """The connection to the apiserver closed before any answer to the script's exec (an
    apiserver restarting, a load balancer): the launcher's record shows the script never
    started, so it runs once more, once. It was told as "did not run" and never ran."""
    out = tmp_path / "runs"
    hook = tmp_path / "count.sh"
    hook.write_text(f'echo "$1" >> {out}\n')
    cluster.create(job("hookdrop", replicas=2, shared=tmp_path), ns)
    running(cluster, ns, "hookdrop")
    cluster.proxy.inject("get", "pods/exec", 0)
    manifest = scalein("dropped", "hookdrop", count=1)
    manifest["spec"]["script"] = str(hook)
    cluster.create(manifest, ns)
    settled(cluster, ns, SI, "dropped", "ScaleSucceeded")
    cond = wait_for(lambda: cluster.condition(ns, "dropped", "ScriptExecuted", SI), 20, "told")
    assert cond is not None and cond["status"] == "True" and "exited 0" in cond["message"], cond
    assert cluster.proxy.pending() == []  # the first exec got no answer
    assert out.read_text().splitlines() == ["hookdrop-worker-1:1"]


@pytest.mark.faults
def test_conflicts_mid_scale_never_scale_twice(cluster: Cluster, ns: str) -> None:
    cluster.create(job("cf", replicas=2, maxReplicas=6), ns)
    running(cluster, ns, "cf")
    # The next freeze of the scaler's plan and the next job status write both get a 409.
    cluster.proxy.inject("patch", "scaleouts/status", 409)
    cluster.proxy.inject("patch", "trainingjobs/status", 409)
    cluster.create(scaleout("once-only", "cf", 1), ns)
    st = settled(cluster, ns, SO, "once-only", "ScaleSucceeded")
    assert cluster.proxy.pending() == []  # both faults were hit
    assert st["addPods"] == ["cf-worker-2"]
    assert cluster.pods(ns, "cf", "worker") == ["cf-worker-0", "cf-worker-1", "cf-worker-2"]
    assert cluster.status(ns, "cf")["lastWorkerIndex"] == 2
    wait_for(lambda: spec_replicas(cluster, ns, "cf") == 3, 5, "spec replicas at the new size")


def test_worker_failure_during_a_scale(cluster: Cluster, ns: str) -> None:
    cluster.create(job("wfs", replicas=2, maxReplicas=5, workerRestartPolicy="Always"), ns)
    running(cluster, ns, "wfs")
    cluster.hold()
    cluster.create(scaleout("mid", "wfs", 1, timeout=60), ns)
    wait_for(lambda: "wfs-worker-2" in cluster.pods(ns, "wfs", "worker"), 10, "worker 2 made")
    cluster.annotate(ns, "wfs-worker-2", REFUSE_KEY, "true")  # it runs, but is never ready
    cluster.release()
    wait_for(lambda: cluster.phase(ns, "mid", SO) == "Scaling", 10)
    cluster.finish(ns, "wfs-worker-0", 1)
    # Out of the host list at once and replaced, while the ScaleOut still waits.
    wait_for(lambda: cluster.hosts(ns, "wfs") == ["wfs-worker-1", "wfs-worker-3"], 15)
    assert cluster.phase(ns, "mid", SO) == "Scaling"
    cluster.accept_key(ns, "wfs-worker-2")
    settled(cluster, ns, SO, "mid", "ScaleSucceeded")
    assert cluster.hosts(ns, "wfs") == ["wfs-worker-1", "wfs-worker-2", "wfs-worker-3"]
    assert cluster.pods(ns, "wfs", "worker") == ["wfs-worker-1", "wfs-worker-2", "wfs-worker-3"]


def test_deleting_a_running_scale_out_removes_its_workers(cluster: Cluster, ns: str) -> None:
    cluster.create(job("cx", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "cx")
    cluster.hold()
    cluster.create(scaleout("undo", "cx", 1, timeout=60), ns)
    wait_for(lambda: "cx-worker-2" in cluster.pods(ns, "cx", "worker"), 10)
    cluster.api.delete(SO, ns, "undo")
    wait_for(lambda: cluster.pods(ns, "cx", "worker") == ["cx-worker-0", "cx-worker-1"], 10)
    cond = cluster.condition(ns, "cx", "Scaling")
    assert cond and cond["reason"] == "ScaleCancelled" and "cx-worker-2" in cond["message"]
    assert cluster.hosts(ns, "cx") == ["cx-worker-0", "cx-worker-1"]
    wait_for(lambda: cluster.phase(ns, "cx") == "Running", 10)


def test_deleting_a_running_scale_in_keeps_its_workers(cluster: Cluster, ns: str) -> None:
    cluster.create(job("ci", replicas=2), ns)
    running(cluster, ns, "ci")
    with horovod_process(cluster, ns, "ci", "ci-worker-1", "ci-worker-1"):
        cluster.create(scalein("undo", "ci", count=1, timeout=60), ns)
        wait_for(lambda: cluster.hosts(ns, "ci") == ["ci-worker-0"], 10, "victim out of the list")
        cluster.api.delete(SI, ns, "undo")
        # The victim rejoins the host list; nothing is deleted.
        wait_for(lambda: cluster.hosts(ns, "ci") == ["ci-worker-0", "ci-worker-1"], 10)
    assert cluster.pods(ns, "ci", "worker") == ["ci-worker-0", "ci-worker-1"]
    assert (cluster.condition(ns, "ci", "Scaling") or {}).get("reason") == "ScaleCancelled"


def spec_replicas(cluster: Cluster, ns: str, name: str) -> int:
    return int(cluster.job(ns, name)["spec"]["etReplicaSpecs"]["worker"]["replicas"])


def test_a_failed_kubectl_scale_gives_back_the_real_size(cluster: Cluster, ns: str) -> None:
    cluster.create(job("kf", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "kf")
    cluster.hold()
    cluster.kubectl("scale", "tj", "kf", "-n", ns, "--replicas", "3")
    wait_for(lambda: "kf-worker-2" in cluster.pods(ns, "kf", "worker"), 20, "worker 2 made")
    assert spec_replicas(cluster, ns, "kf") == 3  # the target, while the scale runs
    # It fails as it starts (e.g. a bad image entrypoint): the scale cannot be done.
    cluster.annotate(ns, "kf-worker-2", EXIT_AT_START, "1")
    cluster.release()
    (made,) = cluster.api.list(SO, ns)
    settled(cluster, ns, SO, made["metadata"]["name"], "ScaleFailed")
    wait_for(lambda: spec_replicas(cluster, ns, "kf") == 2, 10, "the real size given back")
    assert cluster.hosts(ns, "kf") == ["kf-worker-0", "kf-worker-1"]
    # Asking for the same size again is a new request, not a no-op.
    cluster.kubectl("scale", "tj", "kf", "-n", ns, "--replicas", "3")
    wait_for(lambda: len(cluster.hosts(ns, "kf")) == 3, 20, "scaled to 3")
    assert spec_replicas(cluster, ns, "kf") == 3


def test_a_lost_worker_gives_back_the_real_size(cluster: Cluster, ns: str) -> None:
    """Not replaced (restartPolicy Never), a lost worker lowers spec replicas to what runs, so
    `kubectl scale` (or an autoscaler) back to the old size is a request, not a no-op."""
    cluster.create(job("lw", replicas=3, maxReplicas=4), ns)
    running(cluster, ns, "lw", 3)
    cluster.finish(ns, "lw-worker-1", 137)
    wait_for(lambda: cluster.hosts(ns, "lw") == ["lw-worker-0", "lw-worker-2"], 10, "unlisted")
    wait_for(lambda: spec_replicas(cluster, ns, "lw") == 2, 10, "the real size given back")
    cluster.kubectl("scale", "tj", "lw", "-n", ns, "--replicas", "3")
    wait_for(lambda: len(cluster.hosts(ns, "lw")) == 3, 20, "scaled back to 3")
    assert cluster.hosts(ns, "lw") == ["lw-worker-0", "lw-worker-2", "lw-worker-3"]
    assert spec_replicas(cluster, ns, "lw") == 3


def test_kubectl_scale_waits_out_a_scaler_squatting_on_its_name(cluster: Cluster, ns: str) -> None:
    cluster.create(job("sq", replicas=1, maxReplicas=4), ns)
    running(cluster, ns, "sq", workers=1)
    generation = int(cluster.job(ns, "sq")["metadata"]["generation"])
    squatter = f"sq-replicas-{generation + 1}"  # what the next `kubectl scale` would make
    cluster.create(scaleout(squatter, "someone-else", 1), ns)
    cluster.kubectl("scale", "tj", "sq", "-n", ns, "--replicas", "2")
    blocked = wait_for(lambda: cluster.condition(ns, "sq", "Blocked") or {}, 10, "Blocked")
    assert blocked["status"] == "True" and squatter in blocked["message"], blocked
    cluster.wait_event(ns, "sq", "ChildConflict", "Warning")
    assert cluster.hosts(ns, "sq") == ["sq-worker-0"]
    cluster.api.delete(SO, ns, squatter)
    wait_for(lambda: len(cluster.hosts(ns, "sq")) == 2, 20, "scaled to 2 once it is gone")
    wait_for(lambda: (cluster.condition(ns, "sq", "Blocked") or {}).get("status") == "False", 10)


@pytest.mark.parametrize("labelled", [False, True])
def test_scale_out_onto_a_pod_name_someone_else_holds(
    cluster: Cluster, ns: str, labelled: bool
) -> None:
    """Also when the squatter wears the job's labels (a copied worker manifest): it is seen by
    the operator's pod watch, yet it is not the job's, and Blocked ends with the ScaleOut."""
    cluster.create(job("fp", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "fp")
    labels = {"group-name": "kai.alibabacloud.com", "training-job-name": "fp",
              "training-job-role": "worker", "replica-index": "2"} if labelled else {}  # fmt: skip
    squatter = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fp-worker-2", "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    cluster.api.create(squatter)
    cluster.create(scaleout("grow", "fp", 1, timeout=300), ns)
    st = settled(cluster, ns, SO, "grow", "ScaleFailed", timeout=15)
    message = st["conditions"][-1]["message"]
    assert "fp-worker-2 exists and is not this job's; nothing added" in message, message
    assert cluster.api.get("Pod", ns, "fp-worker-2") is not None  # not ours to remove
    assert cluster.hosts(ns, "fp") == ["fp-worker-0", "fp-worker-1"]
    created = cluster.condition(ns, "fp", "Created") or {}
    assert created.get("status") == "True"  # conditions of earlier passes are kept
    # Blocked while the name was in the way, cleared once nothing is.
    wait_for(lambda: (cluster.condition(ns, "fp", "Blocked") or {}).get("status") == "False", 10)


def test_a_running_scaler_script_holds_up_nothing_else(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    hook = tmp_path / "slow.sh"
    started = tmp_path / "started"
    hook.write_text(f"touch {started}; while [ ! -e {gate} ]; do sleep 0.1; done\n")
    cluster.create(job("slow", replicas=3, maxReplicas=4, shared=tmp_path), ns)
    running(cluster, ns, "slow", 3)
    cluster.create(job("other", replicas=1, maxReplicas=3), ns)
    running(cluster, ns, "other", 1)
    manifest = scalein("slowhook", "slow", pod_names=["slow-worker-2"], timeout=120)
    manifest["spec"]["script"] = str(hook)
    cluster.create(manifest, ns)
    wait_for(started.exists, 10, "the script started")
    # While the script runs, the job still handles a lost worker, and other jobs still scale.
    cluster.finish(ns, "slow-worker-0", 1)
    wait_for(lambda: cluster.hosts(ns, "slow") == ["slow-worker-1"], 10, "lost worker out")
    cluster.create(scaleout("meanwhile", "other", 1), ns)
    settled(cluster, ns, SO, "meanwhile", "ScaleSucceeded", timeout=15)
    assert cluster.phase(ns, "slowhook", SI) == "Scaling"
    gate.touch()
    settled(cluster, ns, SI, "slowhook", "ScaleSucceeded")
    cond = cluster.condition(ns, "slowhook", "ScriptExecuted", SI)
    assert cond and cond["status"] == "True"


def test_a_scale_out_horovod_does_not_take_in_says_what_the_launcher_said(
    cluster: Cluster, ns: str
) -> None:
    """Rolled back at its timeout, a ScaleOut said "is horovodrun's --max-np below the new
    size?" though the launcher's ssh to the new worker had failed: it now says what the
    launcher printed of the worker (here the line Horovod's ssh prints for a name that does
    not resolve, written to the launcher's output)."""
    cluster.create(job("said", replicas=1, maxReplicas=2), ns)
    running(cluster, ns, "said", 1)
    with horovod_process(cluster, ns, "said", "said-worker-0", "said-worker-0"):
        # Horovod's ssh fails within seconds of the host's listing; the timeout is long enough
        # for the line to be written (an exec, slow on a loaded machine) and read (every 5 s)
        cluster.create(scaleout("more", "said", 1, timeout=30), ns)
        wait_for(
            lambda: "WaitingForHorovod" in str(cluster.condition(ns, "more", "Scaling", SO)),
            30, "waiting for Horovod",
        )  # fmt: skip
        line = "ssh: Could not resolve hostname said-worker-1: Name or service not known"
        cluster.exec(ns, "said-launcher", "sh", "-c", f"echo '{line}' > /proc/1/fd/1")
        settled(cluster, ns, SO, "more", "ScaleFailed", 60)
    failed = cluster.condition(ns, "more", "ScaleFailed", SO) or {}
    assert line in str(failed.get("message")), failed
    # The scaler's end is written a moment before its job's status.
    wait_for(lambda: cluster.hosts(ns, "said") == ["said-worker-0"], 10, "rolled back")
