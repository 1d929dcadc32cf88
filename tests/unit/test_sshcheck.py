"""The operator's paramiko checks against a real OpenSSH sshd on a loopback address."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from etoperator.builders import ssh
from etoperator.sshcheck import SSHProber, busy_script, load_key
from tests.harness import wait_for

IP, PORT = "127.10.250.2", 2223


def host_key(workdir: Path) -> Path:
    key = workdir / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def sshd_config(ip: str, port: int, hostkey: Path, authorized: Path) -> str:
    """An sshd of this machine trusting one key file (in a scratch directory, whose parents
    StrictModes would refuse)."""
    return "\n".join(
        [
            f"ListenAddress {ip}:{port}",
            f"HostKey {hostkey}",
            f"AuthorizedKeysFile {authorized}",
            "PidFile none",
            "StrictModes no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "LogLevel ERROR",
            "",
        ]
    )


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ssh.KeyPair]:
    tmp = tmp_path_factory.mktemp("sshd")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    keys = ssh.generate_keypair()
    (tmp / "authorized_keys").write_text(keys.public_openssh)
    (tmp / "cfg").write_text(sshd_config(IP, PORT, host_key(tmp), tmp / "authorized_keys"))
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(tmp / "cfg")], stderr=subprocess.DEVNULL
    )
    try:
        wait_for(
            lambda: SSHProber(port=PORT).ready(IP, load_key(keys.private_openssh)), 10, "sshd up"
        )
        yield keys
    finally:
        proc.kill()
        proc.wait()


def test_ready_with_job_key_only(sshd: ssh.KeyPair) -> None:
    prober = SSHProber(port=PORT, timeout=2)
    assert prober.ready(IP, load_key(sshd.private_openssh))
    other = ssh.generate_keypair()
    assert not prober.ready(IP, load_key(other.private_openssh))
    assert not prober.ready("127.10.250.3", load_key(sshd.private_openssh))  # nobody there


def test_busy_until_the_process_exits_exact_match(sshd: ssh.KeyPair) -> None:
    prober = SSHProber(port=PORT, timeout=3)
    key = load_key(sshd.private_openssh)
    assert prober.horovod_running(IP, key, "job-worker-1") is False
    # Started over SSH, as Horovod starts its workers.
    marker = f"etoperator-drain-test-{uuid.uuid4().hex[:8]}"
    code, _ = prober.run(
        IP,
        key,
        f"HOROVOD_HOSTNAME=job-worker-10 nohup bash -c 'exec -a {marker} sleep 60' "
        ">/dev/null 2>&1 & echo started",
    )
    assert code == 0
    try:
        wait_for(lambda: prober.horovod_running(IP, key, "job-worker-10"), 5, "busy")
        assert prober.horovod_running(IP, key, "job-worker-1") is False  # no substring match
    finally:
        subprocess.run(["pkill", "-f", marker])
    wait_for(lambda: prober.horovod_running(IP, key, "job-worker-10") is False, 5, "idle")


def test_busy_script_quotes_the_name() -> None:
    script = busy_script("x'; rm -rf /; echo '")
    assert "'HOROVOD_HOSTNAME=x'\"'\"'; rm -rf /; echo '\"'\"''" in script
