"""A fork server for the operator's restarts: the tests kill and restart the operator over a
hundred times a run, and each new process spent 1.3-1.6 s of CPU importing its libraries
(kopf, the kubernetes client, paramiko). The server imports them once; each line it reads on
stdin is one operator's arguments (JSON), run in a child forked from it, in a session of its
own (its process group is what a kill reaches), output where the server's goes. The child's
pid goes back on the fd named by the server's first argument.

Nothing of etoperator's own is imported before a fork: its settings are read from what
`etoperator.cli.main` sets in the child. The caller's handle on a child is `Forked`."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass, field

from localcluster import procs


def _operator(argv: list[str], report: int, ready: int) -> int:
    """In the child: the operator with `argv`, as `python -m etoperator.cli` runs it. `ready`
    is closed once its session is made: the pid is told only then, so that a kill at once
    reaches its process group."""
    os.close(report)
    os.setsid()
    os.close(ready)
    procs.die_with_parent()  # with the server
    procs.yield_cpu(0)  # a new session: it weighs as the server did
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    from etoperator.cli import main

    return main(argv)


def serve(report: int) -> None:
    """Fork an operator for each line on stdin until it ends; children are reaped by the
    kernel (the caller watches them through pidfds)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    for line in sys.stdin:
        wait, ready = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(wait)
                code = _operator(json.loads(line), report, ready)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(ready)
        os.read(wait, 1)  # its end of the pipe closed: its session made (or it ended)
        os.close(wait)
        os.write(report, f"{pid}\n".encode())


@dataclass
class Forked:
    """A child of the fork server: not ours to wait for, so watched through a pidfd. Its exit
    status is the server's to reap; once it is gone, `returncode` says -1."""

    pid: int
    args: list[str]
    returncode: int | None = None
    _fd: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        try:
            self._fd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # gone already
            self.returncode = -1

    def poll(self) -> int | None:
        return self._gone(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._gone(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def _gone(self, timeout: float | None) -> int | None:
        if self._fd is not None and select.select([self._fd], [], [], timeout)[0]:
            os.close(self._fd)
            self._fd = None
            self.returncode = -1
        return self.returncode


if __name__ == "__main__":
    import kopf  # noqa: F401  (imported once, for every child)
    import kubernetes  # noqa: F401
    import paramiko  # noqa: F401
    import prometheus_client  # noqa: F401

    serve(int(sys.argv[1]))
