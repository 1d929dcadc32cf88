"""The operator's own SSH reach into workers (paramiko).

Two questions are asked of a worker, both with the job's private key:
  - is it ready? sshd accepts the key and runs a command, and the worker's name resolves to
    its own address through the cluster's DNS (Horovod reaches it by name, from a pod of the
    same namespace: a worker listed before DNS knows it fails Horovod's ssh);
  - what does Horovod do on it? whether a process carries `HOROVOD_HOSTNAME=<pod>` in its
    environment (the match is on the whole variable, so `worker-1` never matches
    `worker-10`), and the addresses those processes hold TCP connections to: Horovod's
    collectives connect every rank to every other once its rendezvous is done, so a new
    worker connected to all other hosts trains at the new size.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import shlex
from dataclasses import dataclass

import paramiko

from etoperator.builders.pods import find_horovod

log = logging.getLogger(__name__)

_KEY_TYPES: tuple[type[paramiko.PKey], ...] = (
    paramiko.Ed25519Key,
    paramiko.ECDSAKey,
    paramiko.RSAKey,
)


class SSHUnavailable(Exception):
    """The worker could not be reached or refused the key."""


def load_key(private_key: str) -> paramiko.PKey:
    for cls in _KEY_TYPES:
        try:
            return cls.from_private_key(io.StringIO(private_key))
        except (paramiko.SSHException, ValueError):
            continue
    raise SSHUnavailable("the job's private key is in no format paramiko reads")


class _AcceptAny(paramiko.MissingHostKeyPolicy):
    # Worker host keys are generated at pod start; there is nothing to pin them to.
    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        return None


def busy_script(hostname: str) -> str:
    """Prints `idle` when no process on the host carries HOROVOD_HOSTNAME=<hostname>; else
    `busy`, then `inode <n>` for each socket those processes hold, then the kernel's TCP
    tables (`horovod_state` reads which of those sockets are connected, and to whom)."""
    return (
        f"{find_horovod(hostname)}; "
        '[ -n "$pids" ] || { echo idle; exit 0; }; echo busy; '
        'for p in $pids; do for f in /proc/$p/fd/*; do l=$(readlink "$f" 2>/dev/null) || continue; '
        'case "$l" in socket:*) i="${l#socket:[}"; echo "inode ${i%]}";; esac; done; done; '
        "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0"
    )


def ready_script(name: str, address: str) -> str:
    """Exits 0 once `name` resolves to `address` here (or the image has no getent to ask)."""
    return (
        "command -v getent >/dev/null 2>&1 || exit 0; "
        f"set -- $(getent hosts -- {shlex.quote(name)}); "
        f'[ "${{1:-}}" = {shlex.quote(address)} ]'
    )


@dataclass(frozen=True)
class HorovodOn:
    """What Horovod does on a worker: whether a process of it runs there, and the addresses
    those processes are connected to."""

    busy: bool
    peers: frozenset[str] = frozenset()


def _address(hexed: str) -> str:
    """An address of /proc/net/tcp{,6} ("0100007F:1F90") as text; IPv4 inside IPv6 as IPv4."""
    raw = bytes.fromhex(hexed.split(":")[0])
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]  # each 32-bit word is host-endian
    flat = b"".join(words)
    if len(flat) == 16 and flat[:12] == b"\0" * 10 + b"\xff\xff":
        flat = flat[12:]
    return str(ipaddress.ip_address(flat))


def horovod_state(out: str) -> HorovodOn:
    """Reads what `busy_script` printed."""
    lines = out.splitlines()
    if not lines or lines[0].strip() != "busy":
        return HorovodOn(False)
    inodes = {ln.split()[1] for ln in lines if ln.startswith("inode ")}
    peers = set()
    for ln in lines:
        f = ln.split()
        # sl local remote st tx:rx tr:when retrnsmt uid timeout inode; st 01 = ESTABLISHED
        if len(f) > 9 and f[3] == "01" and f[9] in inodes:
            peers.add(_address(f[2]))
    return HorovodOn(True, frozenset(peers))


@dataclass(frozen=True)
class SSHProber:
    user: str = "root"
    port: int = 22
    timeout: float = 3.0

    def run(self, host: str, key: paramiko.PKey, command: str) -> tuple[int, str]:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_AcceptAny())
        try:
            client.connect(
                host,
                port=self.port,
                username=self.user,
                pkey=key,
                timeout=self.timeout,
                banner_timeout=self.timeout,
                auth_timeout=self.timeout,
                allow_agent=False,
                look_for_keys=False,
            )
            _, stdout, _ = client.exec_command(command, timeout=self.timeout)
            out = stdout.read().decode(errors="replace")
            return stdout.channel.recv_exit_status(), out
        except (TimeoutError, paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHUnavailable(f"{host}:{self.port}: {exc}") from None
        finally:
            client.close()

    def ready(self, host: str, key: paramiko.PKey, name: str | None = None) -> bool:
        """sshd at `host` takes the key (and `name`, if given, resolves to `host` there)."""
        try:
            code, _ = self.run(host, key, ready_script(name, host) if name else "true")
            return code == 0
        except SSHUnavailable as exc:
            log.debug("worker not ready: %s", exc)
            return False

    def horovod(self, host: str, key: paramiko.PKey, hostname: str) -> HorovodOn | None:
        """What Horovod does on the worker; None when it cannot be asked."""
        try:
            code, out = self.run(host, key, busy_script(hostname))
        except SSHUnavailable as exc:
            log.debug("Horovod check failed: %s", exc)
            return None
        return horovod_state(out) if code == 0 else None
