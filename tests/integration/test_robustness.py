"""Bad input, conflicts, operator restarts and the live host list."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localcluster.manifests import job, scaleout
from tests.harness import Cluster, wait_for
from tests.support.relay import Relay
from tests.support.waits import passes, running

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (
            lambda j: j["spec"]["etReplicaSpecs"]["worker"].update(minReplicas=3),
            "minReplicas must not exceed replicas",
        ),
        (
            lambda j: j["spec"]["etReplicaSpecs"]["worker"].update(maxReplicas=1),
            "replicas must not exceed maxReplicas",
        ),
        (
            lambda j: j["spec"]["etReplicaSpecs"]["worker"].update(replicas=0),
            "worker.replicas in body should be greater than or equal to 1",
        ),
        (lambda j: j["spec"].update(cleanPodPolicy="Sometimes"), "cleanPodPolicy"),
        (lambda j: j["spec"].update(backoffLimit=-1), "backoffLimit"),
        (lambda j: j["spec"]["etReplicaSpecs"].pop("launcher"), "launcher"),
        (
            lambda j: j["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"].update(
                containers=[]
            ),
            "containers",
        ),
    ],
)
def test_schema_rejects(
    cluster: Cluster, ns: str, mutate: Callable[[dict[str, Any]], object], needle: str
) -> None:
    manifest = job("bad")
    mutate(manifest)
    res = cluster.kubectl_create(ns, manifest)
    assert res.returncode != 0 and needle in res.stderr, res.stderr
    assert cluster.api.get("TrainingJob", ns, "bad") is None


def test_schema_bounds_scaler_timeout(cluster: Cluster, ns: str) -> None:
    """A timeout past what timers take (2147479 s overflowed the exec client) never reaches the
    operator: kubectl is told the bound."""
    res = cluster.kubectl_create(ns, scaleout("forever", "j", 1, timeout=2_147_479))
    assert res.returncode != 0
    assert "spec.timeout" in res.stderr and "less than or equal to 86400" in res.stderr
    assert cluster.kubectl_create(ns, scaleout("day", "j", 1, timeout=86_400)).returncode == 0


def test_missing_optional_fields_are_defaulted_not_fatal(cluster: Cluster, ns: str) -> None:
    # The Go operator crashed on a missing worker.replicas or backoffLimit.
    manifest = job("defaults")
    del manifest["spec"]["etReplicaSpecs"]["worker"]["replicas"]
    res = cluster.kubectl_create(ns, manifest)
    assert res.returncode == 0, res.stderr
    running(cluster, ns, "defaults", 1)
    spec = cluster.job(ns, "defaults")["spec"]
    assert spec["backoffLimit"] == 6 and spec["cleanPodPolicy"] == "Running"
    assert spec["etReplicaSpecs"]["worker"]["replicas"] == 1


@pytest.mark.parametrize(
    "name,needle",
    [("a" * 55, "63-character"), ("9lives", "DNS-1035")],
    ids=["too-long", "leading-digit"],
)
def test_bad_name_fails_with_condition_and_event(
    cluster: Cluster, ns: str, name: str, needle: str
) -> None:
    """A name the apiserver accepts for the job but not for its children (a Service name must
    start with a letter) is refused up front, before any child is created."""
    cluster.create(job(name), ns)
    wait_for(lambda: cluster.phase(ns, name) == "Failed", 10, "Failed")
    cond = cluster.condition(ns, name, "Failed")
    assert cond and cond["reason"] == "InvalidSpec" and needle in cond["message"]
    assert cluster.wait_event(ns, name, "InvalidSpec")["type"] == "Warning"
    assert cluster.pods(ns, name) == []
    assert cluster.api.list("Service", ns) == []
    # The operator keeps serving other jobs.
    cluster.create(job("fine"), ns)
    running(cluster, ns, "fine")


def test_foreign_object_is_not_adopted(cluster: Cluster, ns: str) -> None:
    cluster.api.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "taken-config", "namespace": ns},
            "data": {"hostfile": "someone-else:1\n"},
        }
    )
    cluster.create(job("taken"), ns)
    wait_for(
        lambda: (cluster.condition(ns, "taken", "Blocked") or {}).get("status") == "True",
        10,
        "Blocked condition",
    )
    cond = cluster.condition(ns, "taken", "Blocked")
    assert cond and "ConfigMap taken-config exists and is not owned" in cond["message"]
    cluster.wait_event(ns, "taken", "ChildConflict")
    cm = cluster.obj("ConfigMap", ns, "taken-config")
    assert cm["data"] == {"hostfile": "someone-else:1\n"} and not cm["metadata"].get(
        "ownerReferences"
    )
    assert cluster.pods(ns, "taken") == []
    # Once the foreign object is gone, the job proceeds.
    cluster.api.delete("ConfigMap", ns, "taken-config")
    running(cluster, ns, "taken")
    assert (cluster.condition(ns, "taken", "Blocked") or {})["status"] == "False"


def test_a_job_whose_launcher_access_is_someone_elses_says_so_once_and_waits(
    cluster: Cluster, ns: str
) -> None:
    """The launcher's ServiceAccount, Role and RoleBinding exist and are not the job's: it is
    Blocked, naming all three, and says it once. Its Blocked condition flapped at every pass
    (the three named on the pass that read the making's outcome, nothing on the next), a
    status write, a Warning and a making of the three every second. Once they are gone, it runs."""
    rbac_v1 = "rbac.authorization.k8s.io/v1"
    foreign = [("v1", "ServiceAccount"), (rbac_v1, "Role"), (rbac_v1, "RoleBinding")]
    for api, kind in foreign:
        body: dict[str, Any] = {"apiVersion": api, "kind": kind}
        body["metadata"] = {"name": "fx-launcher", "namespace": ns}
        if kind == "RoleBinding":
            body["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": "fx-launcher"}  # fmt: skip
        cluster.api.create(body)
    cluster.create(job("fx", replicas=1), ns)

    def blocked() -> str:
        cond = cluster.condition(ns, "fx", "Blocked") or {}
        return str(cond.get("message")) if cond.get("status") == "True" else ""

    wait_for(lambda: "RoleBinding fx-launcher exists" in blocked(), 20, "Blocked, naming it")
    said = blocked()
    assert all(f"{kind} fx-launcher exists" in said for _, kind in foreign), said
    version = cluster.job(ns, "fx")["metadata"]["resourceVersion"]
    start, deadline = passes(cluster), time.monotonic() + 60
    while passes(cluster) < start + 5:  # passes of its own (resync 3 s), maybe of others'
        assert time.monotonic() < deadline, "passes stopped coming"
        assert cluster.job(ns, "fx")["metadata"]["resourceVersion"] == version, blocked()
    for _, kind in reversed(foreign):
        cluster.api.delete(kind, ns, "fx-launcher")
    running(cluster, ns, "fx", 1)
    assert (cluster.condition(ns, "fx", "Blocked") or {})["status"] == "False"


def test_user_supplied_ssh_secret(cluster: Cluster, ns: str) -> None:
    from etoperator.builders import ssh

    keys = ssh.generate_keypair()
    cluster.api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "my-keys", "namespace": ns},
            "stringData": {"id_rsa": keys.private_openssh, "id_rsa.pub": keys.public_openssh},
        }
    )
    cluster.create(job("own", annotations={"arena.kubeflow.org/ssh-secret": "my-keys"}), ns)
    running(cluster, ns, "own")
    assert cluster.api.get("Secret", ns, "own") is None  # none generated
    pod = cluster.obj("Pod", ns, "own-worker-0")
    vol = next(v for v in pod["spec"]["volumes"] if "secret" in v)
    assert vol["secret"]["secretName"] == "my-keys"


def test_private_key_never_logged_or_evented(cluster: Cluster, ns: str) -> None:
    cluster.create(job("quiet"), ns)
    running(cluster, ns, "quiet")
    secret = cluster.obj("Secret", ns, "quiet")
    private = base64.b64decode(secret["data"]["id_rsa"]).decode()
    body = "".join(private.splitlines()[1:-1])
    log = cluster.operator.log.read_text()
    for line in private.splitlines()[1:-1]:
        assert line not in log
    for ev in cluster.events(ns):
        assert body[:40] not in ev["message"]


def test_operator_restart_converges_without_duplicates(cluster: Cluster, ns: str) -> None:
    cluster.hold()
    cluster.create(job("rst", replicas=2), ns)
    wait_for(lambda: len(cluster.pods(ns, "rst", "worker")) == 2, 10)
    cluster.operator.kill()
    uids = {
        p: cluster.obj("Pod", ns, p)["metadata"]["uid"] for p in cluster.pods(ns, "rst", "worker")
    }
    cluster.release()
    cluster.operator.start()
    running(cluster, ns, "rst")
    # The same two workers, never re-created; one launcher.
    assert {
        p: cluster.obj("Pod", ns, p)["metadata"]["uid"] for p in cluster.pods(ns, "rst", "worker")
    } == uids
    assert cluster.pods(ns, "rst") == ["rst-launcher", "rst-worker-0", "rst-worker-1"]


@pytest.mark.faults
def test_a_watch_answer_cut_mid_event_is_watched_again(cluster: Cluster, ns: str) -> None:
    """A proxy between the operator and the apiserver ends a watch answer cleanly in the middle
    of an event (as one may when the apiserver broke its own answer): the operator watches
    again from the last version it saw, stops for nothing, and sees the event it was cut from."""
    proc = cluster.operator.proc
    cluster.proxy.cut.add("trainingjobs")
    cluster.create(job("cut", replicas=2), ns)
    wait_for(lambda: "trainingjobs" not in cluster.proxy.cut, 30, "the watch answer cut")
    running(cluster, ns, "cut")
    assert cluster.operator.proc is proc and cluster.operator.alive(), cluster.operator.tail(40)


def lost(cluster: Cluster, ns: str, name: str) -> bool:
    """The pod failed, as the API shows it: Failed, or already deleted as the lost worker it is."""
    pod = cluster.api.get("Pod", ns, name)
    if pod is None or "deletionTimestamp" in pod["metadata"]:
        return True
    return (pod.get("status") or {}).get("phase") == "Failed"


def launcher_files(cluster: Cluster, ns: str, name: str) -> tuple[Path, dict[str, str]]:
    """The job's discover_hosts.sh laid out as the launcher's ConfigMap volume lays it out
    (same modes), with a real token of the launcher's account bound to its pod (the per-job
    Role decides), and the environment a pod has."""
    cm = cluster.obj("ConfigMap", ns, f"{name}-config")
    pod = cluster.obj("Pod", ns, f"{name}-launcher")
    volume = next(v for v in pod["spec"]["volumes"] if "configMap" in v)
    etc = Path(tempfile.mkdtemp(prefix="etoperator-edl-"))
    etc.chmod(0o755)
    for item in volume["configMap"]["items"]:
        (etc / item["path"]).write_text(cm["data"][item["key"]])
        (etc / item["path"]).chmod(item["mode"])
    sa = etc / "sa"
    sa.mkdir(mode=0o755)
    token = cluster.kubectl(
        "create", "token", pod["spec"]["serviceAccountName"], "-n", ns,
        "--bound-object-kind=Pod", f"--bound-object-name={name}-launcher",
    ).stdout.strip()  # fmt: skip
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_bytes(cluster.cp.ca.read_bytes())
    for f in sa.iterdir():
        f.chmod(0o644)
    tmp = etc / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    env = {"PATH": "/usr/bin:/bin", "ETOPERATOR_SA_DIR": str(sa), "TMPDIR": str(tmp)}
    return etc, env


def test_discovery_follows_changes_from_one_watch(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """The real discover_hosts.sh, run as the launcher runs it (by a non-root user, as a
    launcher image may well do): changes within two seconds, one watch for any number of
    calls, the last list through an apiserver outage and the current one after it, a dead
    watcher replaced by the next call."""
    cluster.create(job("disc", replicas=3, maxReplicas=4), ns)
    running(cluster, ns, "disc", 3)
    etc, env = launcher_files(cluster, ns, "disc")
    relay = Relay(cluster.cp.port, cluster.cp.address).restore()
    env |= {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(relay.port)}
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    state = etc / "tmp" / f"etoperator-hosts-{ns}-disc"

    def discover() -> list[str]:
        out = subprocess.run(
            [*nobody, str(etc / "discover_hosts.sh")],
            capture_output=True, text=True, env=env, timeout=10,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return [line.split(":")[0] for line in out.stdout.splitlines()]

    def requests() -> list[str]:
        """The verbs of the launcher account's requests (one per request: a watch is
        audited when it starts and again when it ends)."""
        me = f"system:serviceaccount:{ns}:disc-launcher"
        ids = {
            ev["auditID"]: ev["verb"]
            for ev in cluster.cp.audit()
            if (ev.get("user") or {}).get("username") == me
        }
        return sorted(ids.values())

    try:
        assert discover() == ["disc-worker-0", "disc-worker-1", "disc-worker-2"]
        watcher = int((state / "pid").read_text())
        cluster.finish(ns, "disc-worker-1", 1)
        # From the failure seen in the API (the node's kubelet takes its own time to report it:
        # over 10 s once, over 30 s once, beside the suite's trainings). The operator deletes
        # a lost worker at once: a look may find it going or gone, never Failed.
        wait_for(lambda: lost(cluster, ns, "disc-worker-1"), 60, "Failed", interval=0.02)
        t0 = time.monotonic()
        wait_for(
            lambda: discover() == ["disc-worker-0", "disc-worker-2"],
            2.0,
            "the discovery script to drop disc-worker-1",
            interval=0.05,
        )
        print(f"host-list change reached discover_hosts.sh in {time.monotonic() - t0:.2f}s")
        for _ in range(20):
            discover()
        assert int((state / "pid").read_text()) == watcher
        # One list and one watch for all those calls (the list from the watch cache).
        wait_for(lambda: requests() == ["list", "watch"], 5, "one list and one watch")

        # An outage: the last list meanwhile, never an empty one; the current one after it.
        relay.cut()
        cluster.create(scaleout("more", "disc", 1), ns)
        wait_for(lambda: len(cluster.hosts(ns, "disc")) == 3, 20, "the scale-out listed")
        assert discover() == ["disc-worker-0", "disc-worker-2"]
        relay.restore()
        current = cluster.hosts(ns, "disc")
        wait_for(lambda: discover() == current, 5, "the list after the outage", interval=0.1)

        # A dead watcher (as after an OOM kill): the next call starts another, current list.
        subprocess.run(["kill", "-9", str(watcher)], check=True)
        wait_for(lambda: not Path(f"/proc/{watcher}").exists(), 5, "the watcher gone")
        assert discover() == current
        assert int((state / "pid").read_text()) != watcher
    finally:
        relay.cut()
        shutil.rmtree(etc)


@pytest.mark.faults
def test_a_refused_write_is_reported_not_retried_silently(cluster: Cluster, ns: str) -> None:
    """Whatever the apiserver refuses (here every worker create, as an admission webhook or a
    quota might) shows on the job as a Blocked condition with the server's words and a Warning
    event, and clears once the write goes through."""
    cluster.proxy.inject("create", "pods", 403, times=1000)
    try:
        cluster.create(job("refused", replicas=1), ns)
        cond = wait_for(
            lambda: cluster.condition(ns, "refused", "Blocked"), 20, "a Blocked condition"
        )
        assert cond is not None and cond["status"] == "True" and cond["reason"] == "APIRefused"
        assert "injected" in cond["message"] and "Forbidden" in cond["message"]
        assert (
            "POST /api/v1/namespaces/" in cond["message"] and "refused-worker-0" in cond["message"]
        )
        assert cluster.wait_event(ns, "refused", "APIRefused")["type"] == "Warning"
    finally:
        cluster.proxy.clear()
    # Tried again within REFUSED's 10 s, then it starts as any job does.
    wait_for(lambda: cluster.phase(ns, "refused") == "Running", 45, "refused Running")
    wait_for(
        lambda: (cluster.condition(ns, "refused", "Blocked") or {}).get("status") == "False",
        20,
        "Blocked cleared",
    )


def test_deleted_config_map_comes_back_at_once_with_the_host_list(
    cluster: Cluster, ns: str
) -> None:
    """Someone deletes <job>-config: it is back within 2 s with the current host list (never an
    empty one, which would tell Horovod the job has no hosts), and the job says so."""
    cluster.create(job("cmgone", replicas=2), ns)
    running(cluster, ns, "cmgone")
    hosts = cluster.hosts(ns, "cmgone")
    assert hosts == ["cmgone-worker-0", "cmgone-worker-1"]
    uid = cluster.obj("ConfigMap", ns, "cmgone-config")["metadata"]["uid"]
    cluster.api.delete("ConfigMap", ns, "cmgone-config")
    t0 = time.monotonic()

    def back() -> bool:
        cm = cluster.api.get("ConfigMap", ns, "cmgone-config")
        return cm is not None and cm["metadata"]["uid"] != uid

    wait_for(back, 2.0, "the ConfigMap back", interval=0.02)
    print(f"ConfigMap back after {time.monotonic() - t0:.2f}s")
    assert cluster.hosts(ns, "cmgone") == hosts  # the list it had, from the first write on
    events = wait_for(
        lambda: [e for e in cluster.events(ns, "cmgone") if e["reason"] == "ChildRepaired"],
        5,
        "a ChildRepaired event",
    )
    assert events[0]["type"] == "Warning" and "cmgone-config" in events[0]["message"]


def test_deleted_ssh_secret_comes_back_with_the_same_key(cluster: Cluster, ns: str) -> None:
    """Someone deletes the job's SSH Secret: it is back within 2 s with the key pair the running
    workers and the launcher hold, so training goes on and new workers can still join."""
    cluster.create(job("keygone", replicas=1, maxReplicas=3), ns)
    running(cluster, ns, "keygone", 1)
    before = cluster.obj("Secret", ns, "keygone")
    cluster.api.delete("Secret", ns, "keygone")

    def back() -> dict[str, Any] | None:
        s = cluster.api.get("Secret", ns, "keygone")
        return s if s is not None and s["metadata"]["uid"] != before["metadata"]["uid"] else None

    after = wait_for(back, 2.0, "the Secret back", interval=0.02)
    assert after is not None
    for key in ("id_rsa", "id_rsa.pub", "authorized_keys"):
        assert after["data"][key] == before["data"][key], key
    wait_for(
        lambda: any(
            e["reason"] == "ChildRepaired" and "Secret keygone" in e["message"]
            for e in cluster.events(ns, "keygone")
        ),
        5,
        "a ChildRepaired event for the Secret",
    )
    # A new worker (mounting the recreated Secret) passes the operator's SSH check and joins.
    cluster.create(scaleout("more", "keygone", 1), ns)
    wait_for(lambda: cluster.hosts(ns, "keygone") == ["keygone-worker-0", "keygone-worker-1"], 20)


def test_a_secret_rotated_by_an_operator_without_the_key_keeps_old_and_new_working(
    cluster: Cluster, ns: str
) -> None:
    """The operator restarted (it holds no key), then the Secret is deleted: the new key pair
    is trusted next to the old one, so the launcher's old key still reaches new workers."""
    from etoperator.sshcheck import SSHProber, load_key

    cluster.create(job("rot", replicas=1, maxReplicas=3), ns)
    running(cluster, ns, "rot", 1)
    old = base64.b64decode(cluster.obj("Secret", ns, "rot")["data"]["id_rsa"]).decode()
    cluster.operator.restart()
    cluster.api.delete("Secret", ns, "rot")
    # Made again by the new process once it is up (its start is seconds on a loaded machine).
    new = wait_for(lambda: (cluster.api.get("Secret", ns, "rot") or {}).get("data"), 30, "key")
    cluster.wait_event(ns, "rot", "ChildRepaired", "Warning")
    assert new is not None
    assert base64.b64decode(new["id_rsa"]).decode() != old
    trusted = base64.b64decode(new["authorized_keys"]).decode().splitlines()
    assert len(trusted) == 2, trusted
    cluster.create(scaleout("after", "rot", 1), ns)
    wait_for(lambda: cluster.hosts(ns, "rot") == ["rot-worker-0", "rot-worker-1"], 20)
    ip = cluster.ip(ns, "rot-worker-1")
    assert ip and SSHProber(port=cluster.ssh_port).ready(ip, load_key(old))  # the launcher's key


def test_an_ssh_secret_of_another_job_is_refused(cluster: Cluster, ns: str) -> None:
    cluster.create(job("owner", replicas=1), ns)
    running(cluster, ns, "owner", 1)
    thief = job("thief", replicas=1)
    thief["metadata"]["annotations"] = {"arena.kubeflow.org/ssh-secret": "owner"}
    cluster.create(thief, ns)
    blocked = wait_for(lambda: cluster.condition(ns, "thief", "Blocked") or {}, 10, "Blocked")
    assert blocked["status"] == "True" and "belongs to TrainingJob owner" in blocked["message"]
    assert cluster.pods(ns, "thief") == []  # its key never reaches a pod of this job


@pytest.mark.parametrize(
    "kind,name",
    [
        ("Service", "own-worker-1"),
        ("ServiceAccount", "own-launcher"),
        ("Role", "own-launcher"),
        ("RoleBinding", "own-launcher"),
    ],
)
def test_a_deleted_child_is_back_within_two_seconds(
    cluster: Cluster, ns: str, kind: str, name: str
) -> None:
    cluster.create(job("own", replicas=2), ns)
    running(cluster, ns, "own")
    before = cluster.obj(kind, ns, name)["metadata"]["uid"]
    cluster.api.delete(kind, ns, name)

    def back() -> bool:
        obj = cluster.api.get(kind, ns, name)
        return obj is not None and obj["metadata"]["uid"] != before

    wait_for(back, 2.0, f"{kind} {name} back", interval=0.02)
