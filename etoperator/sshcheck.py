"""The operator's own SSH reach into workers (paramiko).

Two questions are asked of a worker, both with the job's private key:
  - is it ready? sshd accepts the key and runs a command, and the worker's name resolves to
    its own address through the cluster's DNS as the launcher resolves it (Horovod reaches it
    by name from the launcher: a worker listed before DNS knows it fails Horovod's ssh, and
    the job with it);
  - what does Horovod do on it? whether a process carries `HOROVOD_HOSTNAME=<pod>` in its
    environment (the match is on the whole variable, so `worker-1` never matches
    `worker-10`), and the addresses those processes hold TCP connections to: Horovod's
    collectives connect every rank to every other once its rendezvous is done, so a new
    worker connected to all other hosts trains at the new size.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import logging
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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


def ready_script(name: str, address: str, resolv: str = "/etc/resolv.conf") -> str:
    """Exits 0 once `name` resolves to `address` through cluster DNS, as the launcher's ssh
    will resolve it (or the image has no getent to ask). Asked on the worker itself, the
    short name always resolved: the kubelet's /etc/hosts maps a pod's own name. So the name
    is asked under the pod's first search domain (`<namespace>.svc.<cluster domain>`, the
    record the launcher's lookup of the short name ends at), which no /etc/hosts holds; the
    short name where resolv.conf has no search list."""
    return (
        "command -v getent >/dev/null 2>&1 || exit 0; d=; "
        'while read -r k v _; do [ "$k" = search ] && d=$v; done '
        f"< {shlex.quote(resolv)} 2>/dev/null; "
        f'n={shlex.quote(name)}; [ -z "$d" ] || n="$n.$d."; '
        'set -- $(RES_OPTIONS="timeout:1 attempts:2" getent hosts -- "$n"); '
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


@dataclass
class _Connection:
    client: paramiko.SSHClient
    used: float


@dataclass(frozen=True)
class SSHProber:
    """Runs commands on workers over SSH. Probes of one worker with one key share a connection
    (a scale asks each second; a new connection each time was a handshake here and a new sshd
    process there); one unused for `idle` seconds is closed by `sweeping` or the next probe,
    whichever comes first, and the oldest goes once `max_open` are open."""

    user: str = "root"
    port: int = 22
    timeout: float = 3.0
    idle: float = 30.0
    max_open: int = 64
    now: Callable[[], float] = time.monotonic
    _open: dict[tuple[str, str], _Connection] = field(default_factory=dict, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False)

    def run(self, host: str, key: paramiko.PKey, command: str) -> tuple[int, str]:
        """The command's exit status and output. A shared connection that no longer opens a
        session (its other end went away: the pod restarted at the same address) is made anew
        once; a command that fails once started is not run again."""
        slot = (host, key.get_base64())
        client = None
        try:
            client, fresh = self._take(slot, key)
            channel = self._session(client, fresh)
            if channel is None:  # a shared connection, dead
                self._drop(slot, client)
                client, _ = self._take(slot, key)  # new, or another probe's just made
                channel = self._session(client, True)
            assert channel is not None
            channel.exec_command(command)
            out = channel.makefile("rb").read().decode(errors="replace")
            return channel.recv_exit_status(), out
        except (TimeoutError, paramiko.SSHException, OSError, EOFError) as exc:
            if client is not None:
                self._drop(slot, client)
            raise SSHUnavailable(f"{host}:{self.port}: {exc}") from None

    def _session(self, client: paramiko.SSHClient, fresh: bool) -> paramiko.Channel | None:
        """A session on the connection; None if a shared one is dead (a new one's failure is
        the probe's answer)."""
        transport = client.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("the connection is closed")
            channel = transport.open_session(timeout=self.timeout)
        except (paramiko.SSHException, OSError, EOFError):
            if fresh:
                raise
            return None
        channel.settimeout(self.timeout)
        return channel

    def sweep(self) -> int:
        """Closes the connections unused for `idle` seconds; how many."""
        now = self.now()
        with self._lock:
            idle = [s for s, c in self._open.items() if now - c.used > self.idle]
            gone = [self._open.pop(s).client for s in idle]
        _close(gone)
        return len(gone)

    async def sweeping(self) -> None:
        """`sweep` every third of `idle`, beside the operator: once the scales end nothing
        probes again, and what they left open would stay open for good."""
        while True:
            await asyncio.sleep(self.idle / 3)
            await asyncio.to_thread(self.sweep)

    def _take(self, slot: tuple[str, str], key: paramiko.PKey) -> tuple[paramiko.SSHClient, bool]:
        """The open connection for `slot`, or a new one (True); closes those left idle, and
        the least recently used beyond `max_open`."""
        self.sweep()
        now = self.now()
        with self._lock:
            conn = self._open.get(slot)
            if conn is not None:
                conn.used = now
        if conn is not None:
            return conn.client, False
        client = self._connect(slot[0], key)
        with self._lock:
            theirs = self._open.get(slot)  # another probe of the worker made one meanwhile
            if theirs is None:
                self._open[slot] = _Connection(client, now)
                by_use = sorted(self._open, key=lambda s: self._open[s].used)
                gone = [self._open.pop(s).client for s in by_use[: -self.max_open]]
            else:
                theirs.used, gone = now, [client]
        _close(gone)
        return (client, True) if theirs is None else (theirs.client, False)

    def _connect(self, host: str, key: paramiko.PKey) -> paramiko.SSHClient:
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
        except BaseException:
            client.close()
            raise
        return client

    def _drop(self, slot: tuple[str, str], client: paramiko.SSHClient) -> None:
        with self._lock:
            conn = self._open.get(slot)
            if conn is not None and conn.client is client:
                del self._open[slot]
        client.close()

    def close(self) -> None:
        """Closes every open connection (at shutdown)."""
        with self._lock:
            gone = [c.client for c in self._open.values()]
            self._open.clear()
        _close(gone)

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


def _close(clients: list[paramiko.SSHClient]) -> None:
    for client in clients:
        client.close()
