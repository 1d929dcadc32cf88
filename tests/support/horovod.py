"""A stand-in for what Horovod starts on a worker (a process carrying HOROVOD_HOSTNAME), for the
integration tier's drain and join checks, where no real horovodrun runs."""

from __future__ import annotations

import base64
import io
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import paramiko

from tests.harness import Cluster, wait_for


@contextmanager
def horovod_process(
    cluster: Cluster, ns: str, job_name: str, on: str, hostname: str
) -> Iterator[threading.Event]:
    """A process started over SSH on worker `on`, as Horovod starts one, until the event is set."""
    secret = cluster.obj("Secret", ns, job_name)
    key = paramiko.Ed25519Key.from_private_key(
        io.StringIO(base64.b64decode(secret["data"]["id_rsa"]).decode())
    )
    ip = cluster.ip(ns, on)
    assert ip is not None
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(
        ip,
        port=cluster.ssh_port,
        username="root",
        pkey=key,
        allow_agent=False,
        look_for_keys=False,
    )
    marker = f"etoperator-test-{ns}-{on}"
    client.exec_command(f"HOROVOD_HOSTNAME={hostname} exec -a {marker} sleep 120")
    wait_for(
        lambda: subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0,
        5,
        "the remote process",
    )
    done = threading.Event()
    try:
        yield done
    finally:
        subprocess.run(["pkill", "-f", marker])
        client.close()
