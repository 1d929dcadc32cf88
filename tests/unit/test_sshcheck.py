"""The operator's paramiko checks against a real OpenSSH sshd on a loopback address."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from etoperator.builders import ssh
from etoperator.builders.pods import find_horovod
from etoperator.sshcheck import HorovodOn, SSHProber, busy_script, load_key, ready_script
from localcluster.procs import free_port
from tests.harness import wait_for

# A port free when the module loads: two runs on one machine (a checkout's and a clone's) each
# start their own sshd.
IP = "127.10.250.2"
PORT = free_port(IP)
# A handshake on a loaded machine (the suite's clusters beside it) takes seconds: a probe gives
# up after this, and would read as "unknown".
PROBE_TIMEOUT = 20


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
        first = SSHProber(port=PORT)
        wait_for(lambda: first.ready(IP, load_key(keys.private_openssh)), 30, "sshd up")
        first.close()
        yield keys
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def prober() -> Iterator[SSHProber]:
    """A prober of the test's sshd, its connections closed after the test: each is an sshd
    process here, which outlives the sshd it came from."""
    made = SSHProber(port=PORT, timeout=PROBE_TIMEOUT)
    yield made
    made.close()


def test_ready_with_job_key_only(sshd: ssh.KeyPair, prober: SSHProber) -> None:
    assert prober.ready(IP, load_key(sshd.private_openssh))
    other = ssh.generate_keypair()
    assert not prober.ready(IP, load_key(other.private_openssh))
    assert not prober.ready("127.10.250.3", load_key(sshd.private_openssh))  # nobody there


def test_busy_until_the_process_exits_exact_match(sshd: ssh.KeyPair, prober: SSHProber) -> None:
    key = load_key(sshd.private_openssh)
    assert busy(prober, key, "job-worker-1") is False
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
        wait_for(lambda: busy(prober, key, "job-worker-10"), 30, "busy")
        assert busy(prober, key, "job-worker-1") is False  # no substring match
    finally:
        subprocess.run(["pkill", "-f", marker])
    wait_for(lambda: busy(prober, key, "job-worker-10") is False, 30, "idle")


def busy(prober: SSHProber, key: paramiko.PKey, hostname: str) -> bool | None:
    """Whether a Horovod process of `hostname` runs there (None: it could not be asked)."""
    state = prober.horovod(IP, key, hostname)
    return None if state is None else state.busy


GREP_WITHOUT_Z = """#!/bin/sh
# A grep that cannot read NUL-separated lines (as in some minimal images).
for a; do case "$a" in -*z*) echo "grep: invalid option -- 'z'" >&2; exit 2;; esac; done
exec /bin/grep "$@"
"""


@pytest.mark.parametrize("grep", ["reads NUL lines", "without -z"])
def test_busy_script_finds_exactly_the_hosts_processes(grep: str, tmp_path: Path) -> None:
    """Both ways the script looks (one grep of every environment, or a grep a process where
    grep has no -z) find the same processes, matched whole, and print nothing else."""
    env = {"PATH": "/usr/bin:/bin"}
    if grep == "without -z":
        (tmp_path / "grep").write_text(GREP_WITHOUT_Z)
        (tmp_path / "grep").chmod(0o755)
        env["PATH"] = f"{tmp_path}:{env['PATH']}"
    ten = subprocess.Popen(["sleep", "60"], env={"HOROVOD_HOSTNAME": "job-worker-10"})
    try:
        for host, want in [("job-worker-10", "busy"), ("job-worker-1", "idle")]:
            out = subprocess.run(
                ["sh", "-c", busy_script(host)], env=env, capture_output=True, text=True
            )
            assert out.stdout.splitlines()[0] == want, (host, out.stdout[:200])
            assert out.stderr == ""
        out = subprocess.run(
            ["sh", "-c", find_horovod("job-worker-10") + '; echo "$pids"'],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert out.stdout.split() == [str(ten.pid)]
    finally:
        ten.kill()
        ten.wait()


def test_busy_script_quotes_the_name() -> None:
    script = busy_script("x'; rm -rf /; echo '")
    assert "'HOROVOD_HOSTNAME=x'\"'\"'; rm -rf /; echo '\"'\"''" in script


def test_horovod_tells_to_whom_its_processes_are_connected(
    sshd: ssh.KeyPair, prober: SSHProber
) -> None:
    """A joining worker is taken in once its Horovod process is connected to the other hosts:
    the probe reads the addresses its sockets are connected to, not those of other processes."""
    key = load_key(sshd.private_openssh)
    marker = f"etoperator-peers-test-{uuid.uuid4().hex[:8]}"
    peer = "127.10.250.9"
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTEN, peer, marker], stdout=subprocess.PIPE, text=True
    )
    assert listener.stdout is not None
    port = int(listener.stdout.readline())
    connect = (
        f"HOROVOD_HOSTNAME=job-worker-3 nohup {sys.executable} -c {shlex.quote(CONNECT)} "
        f"{peer} {port} {marker} >/dev/null 2>&1 & echo started"
    )
    try:
        assert prober.horovod(IP, key, "job-worker-3") == HorovodOn(False)
        assert prober.run(IP, key, connect)[0] == 0
        wait_for(lambda: peers_of(prober, key, "job-worker-3"), 30, "connected")
        assert prober.horovod(IP, key, "job-worker-3") == HorovodOn(True, frozenset({peer}))
        # The listener's end is connected too, but it is not a Horovod process of worker-3.
        assert prober.horovod(IP, key, "job-worker-4") == HorovodOn(False)
    finally:
        subprocess.run(["pkill", "-f", marker])
        listener.kill()
        listener.wait()


def peers_of(prober: SSHProber, key: paramiko.PKey, hostname: str) -> frozenset[str]:
    state = prober.horovod(IP, key, hostname)
    return state.peers if state is not None else frozenset()


LISTEN = """import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); time.sleep(60)
"""
CONNECT = """import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); time.sleep(60)
"""


def test_ready_only_once_the_name_resolves_to_the_worker(
    sshd: ssh.KeyPair, prober: SSHProber, tmp_path: Path
) -> None:
    """Horovod reaches a worker by name: a worker whose name does not resolve (to its own
    address) yet is not ready, whatever its sshd says."""
    key = load_key(sshd.private_openssh)
    assert prober.ready(IP, key)
    assert not prober.ready(IP, key, "etoperator-no-such-host.invalid")
    assert not prober.ready(IP, key, "localhost")  # resolves, but not to this worker's address
    plain = tmp_path / "resolv.conf"
    plain.write_text("nameserver 127.0.0.1\n")
    assert prober.run(IP, key, ready_script("localhost", "127.0.0.1", str(plain)))[0] == 0


def test_a_name_only_etc_hosts_knows_is_not_ready(
    sshd: ssh.KeyPair, prober: SSHProber, tmp_path: Path
) -> None:
    """The kubelet's /etc/hosts maps a pod's own name: asked on the new worker, its short name
    always resolved, while cluster DNS did not know it yet and Horovod's ssh from the launcher
    failed (the job with it). The name is asked under the pod's search domain instead."""
    key = load_key(sshd.private_openssh)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\nsearch ns.svc.etoperator-test.invalid\n")
    assert prober.run(IP, key, ready_script("localhost", "127.0.0.1", str(resolv)))[0] != 0


def connection_of(prober: SSHProber, key: paramiko.PKey) -> tuple[str, str]:
    """The client's end of the connection a command runs on (as sshd saw it), and the pid of
    the sshd process that serves that connection."""
    code, out = prober.run(IP, key, 'set -- $SSH_CONNECTION; echo "$2 $PPID"')
    assert code == 0, out
    port, server = out.split()
    return port, server


def test_probes_of_a_worker_share_one_connection_until_it_breaks(
    sshd: ssh.KeyPair, prober: SSHProber
) -> None:
    """A scale asks a worker every second or so: each probe a new connection was a handshake
    and a new sshd process on the worker each time. Probes of one worker with one key share a
    connection; one whose other end went away (the worker restarted at the same address) is
    made anew, and the probe answers as if nothing had happened."""
    key = load_key(sshd.private_openssh)
    first = connection_of(prober, key)
    assert connection_of(prober, key) == first
    assert prober.ready(IP, key) and connection_of(prober, key) == first
    subprocess.run(["kill", first[1]], check=True)  # the sshd of that connection, as a pod's end
    assert prober.ready(IP, key)
    second = connection_of(prober, key)
    assert second != first
    # Another key is another connection: it must be accepted on its own.
    assert not prober.ready(IP, load_key(ssh.generate_keypair().private_openssh))
    assert connection_of(prober, key) == second


def test_a_connection_left_idle_is_closed_with_no_probe_after_it(sshd: ssh.KeyPair) -> None:
    """Once every scale has ended nothing probes again: the connections they left stayed open
    for good (an sshd process on each worker, a thread here). The prober's sweep, running
    beside the operator, closes them once idle, probe or no probe."""
    prober = SSHProber(port=PORT, timeout=PROBE_TIMEOUT, idle=0.5)
    key = load_key(sshd.private_openssh)

    async def sweep_until_closed(server: str) -> None:
        sweeping = asyncio.create_task(prober.sweeping())
        try:
            while Path(f"/proc/{server}").exists():
                await asyncio.sleep(0.1)
        finally:
            sweeping.cancel()

    try:
        _, server = connection_of(prober, key)
        asyncio.run(asyncio.wait_for(sweep_until_closed(server), 15))
    finally:
        prober.close()


def test_a_connection_unused_for_a_while_is_closed(sshd: ssh.KeyPair) -> None:
    """Each open connection is an sshd process on a worker and a thread here: one left unused
    longer than `idle` is closed at the next probe of any worker."""
    clock = [0.0]
    prober = SSHProber(port=PORT, timeout=PROBE_TIMEOUT, idle=30, now=lambda: clock[0])
    key = load_key(sshd.private_openssh)
    try:
        _, server = connection_of(prober, key)
        clock[0] += 29
        assert not prober.ready("127.10.250.3", key)  # a probe of another (absent) worker
        assert connection_of(prober, key)[1] == server  # not idle long enough
        clock[0] += 31
        assert not prober.ready("127.10.250.3", key)
        wait_for(lambda: not Path(f"/proc/{server}").exists(), 10, "the idle connection's sshd")
    finally:
        prober.close()
