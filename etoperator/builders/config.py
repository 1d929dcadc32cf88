"""The job's ConfigMap: host lists and the discovery script Horovod runs every second.

The script reads the ConfigMap live from the API server with the launcher's service-account
token, so a host-list change reaches Horovod at its next poll (about a second) instead of
waiting for the kubelet's ConfigMap volume sync (a minute or more). When the API server cannot
be reached it prints the last list it read, and failing that, the kubelet-synced copy.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from etoperator import naming
from etoperator.builders.common import Owner, metadata

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# Horovod runs this every second for as long as the job lives, so it is kept cheap: no site
# packages (-S), nothing heavier than socket and ssl imported, one HTTP/1.0 GET (the server
# closes, so the body is what follows the headers).
_READER = r"""
import json, os, socket, ssl, sys

cm, ns, sa, cache, mounted = sys.argv[1:6]


def emit(text):
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(0)


def get(host, port, path, token, ca):
    ctx = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
    name = "[" + host + "]" if ":" in host else host
    request = (
        "GET %s HTTP/1.0\r\nHost: %s:%s\r\nAuthorization: Bearer %s\r\n"
        "Accept: application/json\r\n\r\n" % (path, name, port, token)
    )
    chunks = []
    with socket.create_connection((host, int(port)), timeout=2) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as conn:
            conn.sendall(request.encode())
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        raise ValueError("HTTP status %s" % (b"".join(status).decode() or "missing"))
    return json.loads(body)


try:
    with open(os.path.join(sa, "token")) as f:
        token = f.read().strip()
    # resourceVersion=0: served from the apiserver's watch cache, never a read of etcd.
    obj = get(
        os.environ["KUBERNETES_SERVICE_HOST"],
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        "/api/v1/namespaces/%s/configmaps/%s?resourceVersion=0" % (ns, cm),
        token,
        os.path.join(sa, "ca.crt"),
    )
    text = obj["data"]["hostfile"]
    if not text.strip():
        raise ValueError("the live host list is empty")  # a job never runs on no hosts
except Exception as exc:  # any failure: fall back to the last good list
    sys.stderr.write("discover_hosts: live read failed (%s); using last known list\n" % exc)
    for path in (cache, mounted):
        try:
            with open(path) as f:
                emit(f.read())
        except OSError:
            continue
    sys.exit(1)
try:
    tmp = "%s.%d" % (cache, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, cache)
except OSError:
    pass
emit(text)
"""


def hostfile(hosts: Sequence[str], slots: int) -> str:
    return "".join(f"{h}:{slots}\n" for h in hosts)


def deepspeed_hostfile(hosts: Sequence[str], slots: int) -> str:
    return "".join(f"{h} slots={slots}\n" for h in hosts)


def discover_script(job: str, namespace: str) -> str:
    """A POSIX sh script; every value from the job is validated upstream and quoted here."""
    cm = shlex.quote(naming.config_map_name(job))
    ns = shlex.quote(namespace)
    cache = shlex.quote(f"etoperator-hosts-{namespace}-{job}")
    return (
        "#!/bin/sh\n"
        "# Prints the job's current host list, one '<host>:<slots>' line per worker.\n"
        f'sa="${{ETOPERATOR_SA_DIR:-{SA_DIR}}}"\n'
        f'cache="${{TMPDIR:-/tmp}}/"{cache}\n'
        'mounted="$(dirname "$0")/hostfile"\n'
        "py=$(command -v python3 || command -v python)\n"
        'if [ -z "$py" ]; then exec cat "$mounted"; fi\n'
        f'exec "$py" -S -E - {cm} {ns} "$sa" "$cache" "$mounted" <<\'ETOPERATOR_PY\'\n'
        f"{_READER.strip()}\n"
        "ETOPERATOR_PY\n"
    )


def config_map(
    job: str, namespace: str, owner: Owner, hosts: Sequence[str], slots: int
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(naming.config_map_name(job), namespace, owner, naming.job_labels(job)),
        "data": config_data(job, namespace, hosts, slots),
    }


def config_data(job: str, namespace: str, hosts: Sequence[str], slots: int) -> dict[str, str]:
    return {
        naming.HOSTFILE_KEY: hostfile(hosts, slots),
        naming.DISCOVER_KEY: discover_script(job, namespace),
        naming.DEEPSPEED_KEY: deepspeed_hostfile(hosts, slots),
    }


def hosts_of(data: dict[str, str] | None) -> list[str]:
    """The host names in a ConfigMap's hostfile, in order."""
    text = (data or {}).get(naming.HOSTFILE_KEY, "")
    return [line.rsplit(":", 1)[0] for line in text.splitlines() if line.strip()]
