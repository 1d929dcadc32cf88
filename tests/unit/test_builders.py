from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from etoperator import naming
from etoperator.api.models import JobSpec, parse_job
from etoperator.builders import config, pods, rbac, ssh
from etoperator.builders.common import Owner, is_controlled_by
from localcluster.manifests import job

OWNER = Owner("TrainingJob", "j", "uid-1")
CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$|^[A-Z]|[./-]")


def spec(**kw: Any) -> JobSpec:
    b = job("j", **kw)
    b["metadata"].update(namespace="ns", uid="uid-1")
    del b["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["command"]
    b["spec"]["etReplicaSpecs"]["worker"]["template"]["metadata"] = {
        "labels": {"team": "ml"},
        "annotations": {"sidecar": "off"},
    }
    return parse_job(b)


def keys(obj: object) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(k)
            out |= keys(v)
    elif isinstance(obj, list):
        for v in obj:
            out |= keys(v)
    return out


def test_worker_pod() -> None:
    s = spec()
    before = copy.deepcopy(s.worker.template)
    pod = pods.worker_pod(s, OWNER, 3, "j", ssh.OWN_KEYS)
    assert s.worker.template == before  # input untouched
    meta = pod["metadata"]
    assert meta["name"] == "j-worker-3"
    assert meta["labels"] == {
        "team": "ml",
        "group-name": naming.GROUP,
        "training-job-name": "j",
        "training-job-role": "worker",
        "replica-index": "3",
    }
    assert meta["annotations"] == {"sidecar": "off"}
    assert is_controlled_by(pod, "uid-1")
    assert pod["spec"]["restartPolicy"] == "Never"
    c = pod["spec"]["containers"][0]
    assert c["command"] == pods.DEFAULT_WORKER_COMMAND
    assert {"name": pods.SSH_VOLUME, "mountPath": "/root/.ssh"} in c["volumeMounts"]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == pods.SSH_VOLUME)
    assert vol["secret"]["defaultMode"] == 0o600
    items = {(i["key"], i["path"]) for i in vol["secret"]["items"]}
    assert ("authorized_keys", "authorized_keys") in items and ("config", "config") in items
    # A user's Secret without authorized_keys: its public key is trusted alone.
    user = pods.worker_pod(s, OWNER, 3, "j", frozenset({"id_rsa", "id_rsa.pub"}))
    vol = next(v for v in user["spec"]["volumes"] if v["name"] == pods.SSH_VOLUME)
    assert {(i["key"], i["path"]) for i in vol["secret"]["items"]} == {
        ("id_rsa", "id_rsa"),
        ("id_rsa.pub", "id_rsa.pub"),
        ("id_rsa.pub", "authorized_keys"),
    }
    assert all(not k.startswith("_") and "_" not in k for k in keys(pod) - {"nvidia.com/gpu"})


def test_worker_keeps_its_own_command() -> None:
    s = spec()
    b = job("j")
    b["metadata"].update(namespace="ns", uid="uid-1")
    b["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["command"] = [
        "/start.sh"
    ]
    pod = pods.worker_pod(parse_job(b), OWNER, 0, "j", frozenset())
    assert pod["spec"]["containers"][0]["command"] == ["/start.sh"]
    assert s is not None


def test_launcher_pod_mounts_and_modes() -> None:
    s = spec()
    pod = pods.launcher_pod(s, OWNER, "j", ssh.OWN_KEYS, 3)
    assert pod["metadata"]["annotations"][naming.ANN_RUN] == "3"
    assert pod["metadata"]["name"] == "j-launcher"
    assert pod["metadata"]["labels"]["training-job-role"] == "launcher"
    assert pod["spec"]["serviceAccountName"] == "j-launcher"
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"/root/.ssh", "/etc/edl"}
    cfg = next(v for v in pod["spec"]["volumes"] if v["name"] == pods.CONFIG_VOLUME)
    modes = {i["path"]: i["mode"] for i in cfg["configMap"]["items"]}
    # Readable (and the script executable) by a non-root launcher: never 0600.
    assert modes == {"discover_hosts.sh": 0o755, "hostfile": 0o644, "deepspeed-hostfile": 0o644}


def test_the_launcher_gives_a_joining_worker_time_to_start_unless_told_otherwise() -> None:
    def env(s: JobSpec) -> dict[str, str]:
        pod = pods.launcher_pod(s, OWNER, "j", ssh.OWN_KEYS, 0)
        return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}

    for name in ("HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_START_TIMEOUT"):
        assert int(env(spec())[name]) > 30  # Horovod's own: too short
        b = job("j")
        b["metadata"].update(namespace="ns", uid="uid-1")
        launcher = b["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]
        launcher["env"] = [{"name": name, "value": "45"}]
        assert env(parse_job(b))[name] == "45"


def test_the_rendezvous_timeout_is_read_as_horovodrun_reads_it() -> None:
    def timeout(command: list[str], env: list[dict[str, str]] | None = None) -> int:
        b = job("j")
        c = b["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0]
        c["command"], c["env"] = command, env or []
        return parse_job(b).launcher.rendezvous_timeout

    run = ["horovodrun", "-np", "2", "python3", "train.py"]
    assert timeout(run) == naming.RENDEZVOUS_TIMEOUT
    assert timeout(["horovodrun", "--gloo-timeout-seconds", "90", *run[1:]]) == 90
    assert timeout(["horovodrun", "--gloo-timeout-seconds=75", *run[1:]]) == 75
    assert timeout(run, [{"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", "value": "45"}]) == 45
    assert (
        timeout(run, [{"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", "value": "$(T)"}])
        == naming.RENDEZVOUS_TIMEOUT
    )


def test_worker_service_selects_exactly_one_pod() -> None:
    svc = pods.worker_service(spec(), OWNER, 4)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"]["replica-index"] == "4"
    assert sorted(p["port"] for p in svc["spec"]["ports"]) == [22, 9009]


def test_configmap_contents() -> None:
    cm = config.config_map("j", "ns", OWNER, ["j-worker-0", "j-worker-2"], 2)
    assert cm["data"]["hostfile"] == "j-worker-0:2\nj-worker-2:2\n"
    assert cm["data"]["deepspeed-hostfile"] == "j-worker-0 slots=2\nj-worker-2 slots=2\n"
    assert config.hosts_of(cm["data"]) == ["j-worker-0", "j-worker-2"]
    assert config.config_map("j", "ns", OWNER, [], 1)["data"]["hostfile"] == ""


def test_discover_script_is_valid_sh_and_falls_back(tmp_path: Path) -> None:
    script = tmp_path / "discover_hosts.sh"
    script.write_text(config.discover_script("j", "ns"))
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    script.chmod(0o755)
    (tmp_path / "hostfile").write_text("j-worker-0:1\n")
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "ETOPERATOR_SA_DIR": str(tmp_path)}
    # No API server: no cached list yet, so the mounted copy.
    out = subprocess.run([str(script)], capture_output=True, text=True, env=env)
    assert out.stdout == "j-worker-0:1\n"


def test_rbac_names_plural_resource() -> None:
    role = rbac.launcher_role("j", "ns", OWNER, own_pod=False)
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["j-config"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    # a torchrun launcher reads its own pod too (whether it is being deleted), no other
    own = rbac.launcher_role("j", "ns", OWNER, own_pod=True)["rules"][1:]
    pod = {"apiGroups": [""], "resources": ["pods"], "resourceNames": ["j-launcher"]}
    assert own == [{**pod, "verbs": ["get"]}]
    binding = rbac.launcher_binding("j", "ns", OWNER, "custom-sa")
    assert binding["subjects"][0]["name"] == "custom-sa"


def test_ssh_secret_keys() -> None:
    keys_ = ssh.generate_keypair("c")
    sec = ssh.ssh_secret("j", "ns", OWNER, keys_)
    assert set(sec["stringData"]) == {"id_rsa", "id_rsa.pub", "authorized_keys", "config"}
    assert sec["stringData"]["id_rsa"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert sec["stringData"]["id_rsa.pub"].startswith("ssh-ed25519 ")
    assert "StrictHostKeyChecking no" in sec["stringData"]["config"]
    assert "PRIVATE" not in repr(keys_)
    assert ssh.missing_keys({"data": {"id_rsa": "x"}}) == ["id_rsa.pub"]


def test_a_rotated_secret_trusts_the_old_key_once() -> None:
    keys = ssh.generate_keypair("j")
    old = ssh.generate_keypair("j").public_openssh
    secret = ssh.ssh_secret("j", "ns", OWNER, keys, ("", keys.public_openssh, old))
    trusted = secret["stringData"]["authorized_keys"].splitlines()
    assert trusted == [keys.public_openssh.strip(), old.strip()]


def test_workers_on_the_node_s_network_claim_the_ssh_port() -> None:
    """Two hostNetwork workers on one node: the second sshd cannot bind port 22, and the job
    sat Created. Declared as the container's port (a host port with hostNetwork), the
    scheduler keeps them apart."""
    body = job("j", replicas=2)
    body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["hostNetwork"] = True
    body["metadata"].update(namespace="ns", uid="u")
    spec = parse_job(body)
    pod = pods.worker_pod(spec, Owner("TrainingJob", "j", "u"), 0, "j", frozenset())
    ports = pod["spec"]["containers"][0]["ports"]
    assert {"name": "ssh", "containerPort": 22, "protocol": "TCP"} in ports
    plain = parse_job({**job("k", replicas=1), "metadata": {"name": "k", "namespace": "ns"}})
    assert (
        "ports"
        not in pods.worker_pod(plain, Owner("TrainingJob", "k", "u"), 0, "k", frozenset())["spec"][
            "containers"
        ][0]
    )


def test_a_horovod_job_s_ranks_learn_where_the_shared_volume_is() -> None:
    """horovodrun starts the ranks over SSH with the launcher's environment: the launcher
    carries CHECKPOINT_DIR (the workers' mount path); it mounts the volume too, for the save
    handshake its preStop runs there."""
    from etoperator.builders import runtimes

    body = job("j", sharedVolume={"storage": "1Gi", "mountPath": "/ckpt"})
    body["metadata"].update(namespace="ns", uid="uid-1")
    s = parse_job(body)
    (launcher,) = runtimes.of(s).launcher(s, OWNER, 0, ("j", ssh.OWN_KEYS), 2)
    first = launcher["spec"]["containers"][0]
    assert {"name": naming.CHECKPOINT_ENV, "value": "/ckpt"} in first["env"]
    claims = [v["persistentVolumeClaim"] for v in launcher["spec"]["volumes"]
              if v.get("persistentVolumeClaim")]  # fmt: skip
    assert claims == [{"claimName": naming.shared_claim_name("j")}]
    hook = first["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert naming.SAVE_REQUEST in hook and "/ckpt" in hook
    worker = runtimes.of(s).worker_pod(s, OWNER, 0, 0, ("j", ssh.OWN_KEYS))
    assert {"name": naming.CHECKPOINT_ENV, "value": "/ckpt"} in worker["spec"]["containers"][0][
        "env"
    ]


@pytest.mark.parametrize(
    ("argv", "size", "want"),
    [
        (["horovodrun", "-np", "3", "--min-np", "1", "python", "t.py"], 2, "-np 2 --min-np 1"),
        (["/usr/bin/horovodrun", "--num-proc", "4", "x"], 1, "--num-proc 1 x"),
        (["horovodrun", "-np", "2", "--min-np", "2", "x"], 1, "-np 2 --min-np 2"),  # not below min
        (["horovodrun", "-np", "1", "x"], 3, "-np 1 x"),  # never raised: Horovod takes every slot
        (["sh", "-c", "horovodrun -np 3 x"], 1, "horovodrun -np 3 x"),  # a shell's: not ours
        (["horovodrun", "--num-proc=4", "python3", "t.py", "-np", "9"], 2, "-np 9"),
        (["horovodrun", "--num-proc=4", "python3", "t.py"], 2, "--num-proc 2 python3 t.py"),
    ],
)
def test_a_horovod_run_starts_with_the_workers_it_has(
    argv: list[str], size: int, want: str
) -> None:
    """Elastic horovodrun waits for -np slots before it starts (up to its --elastic-timeout,
    600 s, then fails): a run that starts smaller than the launcher's -np (a resume after a
    ScaleIn, a partial admission) must not wait for workers that never come."""
    from etoperator.builders import runtimes

    body = job("j", replicas=3, minReplicas=1)
    body["metadata"].update(namespace="ns", uid="uid-1")
    body["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]["containers"][0].update(
        command=argv[:1], args=argv[1:]
    )
    s = parse_job(body)
    (launcher,) = runtimes.of(s).launcher(s, OWNER, 0, ("j", ssh.OWN_KEYS), size)
    first = launcher["spec"]["containers"][0]
    assert first["command"] == argv[:1]
    assert want in " ".join(first["args"])
