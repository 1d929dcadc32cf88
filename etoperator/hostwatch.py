"""The launcher's host list, kept in a local file by one long-lived watch of the job's ConfigMap.

Not imported by the operator: its source is shipped in the job's ConfigMap and run by
discover_hosts.sh (`python3 -S -E -`: standard library only, any Python 3.7+ the launcher image
has) whenever no watcher is alive. Horovod runs discover_hosts.sh every second; while a watcher
lives that is `cat` of the file, so the apiserver sees one watch per launcher (reopened every 30
to 60 minutes when the server times it out), not one request a second.

Files in the state directory: `hosts` (the list, replaced atomically, never empty), `pid` (the
watcher's, written once its first list is in `hosts`), `lock` (held by the live watcher).
During an apiserver outage the file keeps the last list; the watch is reopened within
BACKOFF_MAX of the server's return and resumes from the last version it saw (or lists again).
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO
from urllib.parse import quote

CONNECT_TIMEOUT = 2.0
IDLE_TIMEOUT = 150.0  # the apiserver's watch cache sends a bookmark about every minute
FIRST_LIST_WAIT = 3.0  # how long the call that starts a watcher waits for its first list
BACKOFF_MAX = 2.0
GIVE_UP = 300.0  # failing this long, a watcher exits; the next discovery call starts another
OWNER_CHECK = 2.0  # how often a watcher checks that its directory still names it


class Gone(Exception):
    """The version the watch resumes from is older than the server keeps: list again."""


class Api:
    """GETs on the job's ConfigMap with the launcher's service-account token."""

    def __init__(self, sa: str, namespace: str, name: str) -> None:
        self.sa, self.name = sa, name
        self.base = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
        self.host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        self.port = int(os.environ.get("KUBERNETES_SERVICE_PORT", "443"))

    def open(self, query: str) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        ca = os.path.join(self.sa, "ca.crt")
        ctx = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        with open(os.path.join(self.sa, "token")) as f:  # re-read: the kubelet rotates it
            token = f.read().strip()
        conn = http.client.HTTPSConnection(
            self.host, self.port, timeout=CONNECT_TIMEOUT, context=ctx
        )
        selector = quote(f"metadata.name={self.name}")
        conn.request(
            "GET",
            f"{self.base}?fieldSelector={selector}&{query}",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        if conn.sock is not None:
            conn.sock.settimeout(IDLE_TIMEOUT)
        resp = conn.getresponse()
        if resp.status == 410:
            conn.close()
            raise Gone()
        if resp.status != 200:
            conn.close()
            raise OSError(f"HTTP status {resp.status} {resp.reason}")
        return conn, resp

    def list(self) -> tuple[str | None, str]:
        """(host list or None, resourceVersion), from the apiserver's watch cache."""
        conn, resp = self.open("resourceVersion=0")
        with contextlib.closing(conn):
            body = json.loads(resp.read())
        items = body.get("items") or []
        return (hosts_of(items[0]) if items else None), body["metadata"]["resourceVersion"]

    def watch(self, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) until the server ends the watch."""
        conn, resp = self.open(f"watch=1&allowWatchBookmarks=true&resourceVersion={version}")
        with contextlib.closing(conn):
            for line in iter(resp.readline, b""):
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    code = (event.get("object") or {}).get("code")
                    raise Gone() if code == 410 else OSError(f"watch error {code}")
                yield event["type"], event["object"]


def hosts_of(cm: dict[str, Any]) -> str | None:
    text = (cm.get("data") or {}).get("hostfile") or ""
    return text if text.strip() else None  # a job never runs on no hosts


def replace(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class Watcher:
    def __init__(self, api: Api, state: str) -> None:
        self.api, self.state = api, state
        self.hosts = os.path.join(state, "hosts")
        self.version: str | None = None
        self.announced = False

    def keep(self, text: str | None) -> None:
        if text is not None and text != read(self.hosts):
            replace(self.hosts, text)
        if not self.announced and read(self.hosts):
            replace(os.path.join(self.state, "pid"), f"{os.getpid()}\n")
            self.announced = True

    def follow(self) -> None:
        """List if needed, then apply the watch's events until it ends."""
        if self.version is None:
            text, self.version = self.api.list()
            self.keep(text)
        for kind, obj in self.api.watch(self.version):
            self.version = obj["metadata"]["resourceVersion"]
            if kind in ("ADDED", "MODIFIED"):
                self.keep(hosts_of(obj))  # DELETED: the job is going; keep the last list

    def run(self) -> None:
        backoff, failing = 0.1, 0.0  # failing: since when, or 0
        while True:
            try:
                self.follow()
            except Gone:
                self.version = None
                continue
            except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
                if not failing:
                    log(f"watch failed ({exc}); keeping the last list, retrying")
                failing = failing or time.monotonic()
                if time.monotonic() - failing > GIVE_UP:
                    log("giving up; the next discovery call starts a new watcher")
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if failing:
                log("watch restored")
            backoff, failing = 0.1, 0.0


def log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} etoperator hostwatch: {message}\n")
    sys.stderr.flush()


def exit_when_disowned(state: str) -> None:
    """A newer watcher or a removed directory means this one is no longer wanted."""
    mine = f"{os.getpid()}\n"
    while True:
        time.sleep(OWNER_CHECK)
        pid = read(os.path.join(state, "pid"))
        if (pid is not None and pid != mine) or not os.path.isdir(state):
            os._exit(0)


def start(api: Api, state: str) -> int | None:
    """Fork a watcher unless one holds the lock; its pid, else None."""
    lock = os.open(os.path.join(state, "lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    pid = os.fork()
    if pid:
        os.close(lock)  # the child's copy keeps the lock
        return pid
    os.setsid()
    detach(os.path.join(state, "watch.log"))
    with contextlib.suppress(OSError):  # a dead watcher's: none other lives while we hold the lock
        os.unlink(os.path.join(state, "pid"))
    threading.Thread(target=exit_when_disowned, args=(state,), daemon=True).start()
    try:
        Watcher(api, state).run()
    finally:
        os._exit(1)


def detach(logfile: str) -> None:
    """Horovod reads discover_hosts.sh's output to its end: the watcher must not hold it."""
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    os.close(null)
    os.close(err)


def emit(out: TextIO, text: str) -> int:
    out.write(text)
    out.flush()
    return 0


def discover(argv: list[str], out: TextIO) -> int:
    """discover_hosts.sh's slow path: start a watcher if none lives, then print the list."""
    name, namespace, sa, state, mounted = argv[:5]
    api = Api(sa, namespace, name)
    if not api.host or not os.path.exists(os.path.join(sa, "token")):
        log("no service-account token or API server address; printing the mounted list")
        return emit(out, read(mounted) or "")
    try:
        os.makedirs(state, mode=0o700, exist_ok=True)
        child = start(api, state)
    except OSError as exc:  # no writable state directory: one live read, as before
        log(f"cannot keep a host file ({exc}); reading the ConfigMap once")
        try:
            text = api.list()[0]
        except (OSError, ValueError, KeyError, Gone, http.client.HTTPException):
            text = None
        return emit(out, text or read(mounted) or "")
    deadline = time.monotonic() + FIRST_LIST_WAIT
    while child and read(os.path.join(state, "pid")) != f"{child}\n":
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return emit(out, read(os.path.join(state, "hosts")) or read(mounted) or "")


if __name__ == "__main__":
    sys.exit(discover(sys.argv[1:], sys.stdout))
