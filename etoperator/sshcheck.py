"""The operator's own SSH reach into workers (paramiko).

Two questions are asked of a worker, both with the job's private key:
  - is it ready? sshd accepts the key and runs a command (what Horovod will need);
  - has Horovod left it? no process on it carries `HOROVOD_HOSTNAME=<pod>` in its
    environment. The match is on the whole variable, so `worker-1` never matches `worker-10`.
"""

from __future__ import annotations

import io
import logging
import shlex
from dataclasses import dataclass

import paramiko

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
    """Prints `busy` when a process on the host carries HOROVOD_HOSTNAME=<hostname>, else `idle`."""
    needle = shlex.quote(f"HOROVOD_HOSTNAME={hostname}")
    return (
        "for e in /proc/[0-9]*/environ; do "
        f"if tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -qxF -- {needle}; then "
        "echo busy; exit 0; fi; done; echo idle"
    )


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

    def ready(self, host: str, key: paramiko.PKey) -> bool:
        try:
            code, _ = self.run(host, key, "true")
            return code == 0
        except SSHUnavailable as exc:
            log.debug("worker not ready: %s", exc)
            return False

    def horovod_running(self, host: str, key: paramiko.PKey, hostname: str) -> bool | None:
        """True/False from the worker; None when it cannot be asked."""
        try:
            _, out = self.run(host, key, busy_script(hostname))
        except SSHUnavailable as exc:
            log.debug("drain check failed: %s", exc)
            return None
        return out.strip() == "busy"
