"""The job's ConfigMap: host lists and the discovery script Horovod runs every second.

The script prints the list a watcher in the launcher keeps from one long-lived watch of this
ConfigMap (etoperator/hostwatch.py), so a host-list change reaches Horovod at its next poll
(about a second) instead of waiting for the kubelet's ConfigMap volume sync (a minute or
more), and a running job costs the apiserver no request a second. Without a watcher's list
yet it prints the kubelet-synced copy.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from importlib import resources
from typing import Any

from etoperator import naming
from etoperator.builders.common import Owner, metadata

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_WATCHER = (resources.files("etoperator") / "hostwatch.py").read_text()
RENDEZVOUS = (resources.files("etoperator") / "rendezvous.py").read_text()
LEAVE = (resources.files("etoperator") / "leave.py").read_text()
AGENT = (resources.files("etoperator") / "torchagent.py").read_text()


def hostfile(hosts: Sequence[str], slots: int) -> str:
    return "".join(f"{h}:{slots}\n" for h in hosts)


def deepspeed_hostfile(hosts: Sequence[str], slots: int) -> str:
    return "".join(f"{h} slots={slots}\n" for h in hosts)


def discover_script(job: str, namespace: str) -> str:
    """A POSIX sh script; every value from the job is validated upstream and quoted here.

    While the watcher lives (its pid file names a live process) a call is `cat` of its file:
    the shell's builtins and one exec, no Python, no request. Otherwise hostwatch.py starts
    one and prints the list. A state directory in $TMPDIR, else /dev/shm (a read-only root)."""
    cm = shlex.quote(naming.config_map_name(job))
    ns = shlex.quote(namespace)
    state = shlex.quote(f"etoperator-hosts-{namespace}-{job}")
    return (
        "#!/bin/sh\n"
        "# Prints the job's current host list, one '<host>:<slots>' line per worker.\n"
        'd="${TMPDIR:-/tmp}"\n'
        '[ -w "$d" ] || d=/dev/shm\n'
        f'd="$d/"{state}\n'
        'if read -r pid 2>/dev/null <"$d/pid" && kill -0 "$pid" 2>/dev/null; then\n'
        '  exec cat "$d/hosts"\n'
        "fi\n"
        f'sa="${{ETOPERATOR_SA_DIR:-{SA_DIR}}}"\n'
        'mounted="$(dirname "$0")/hostfile"\n'
        "py=$(command -v python3 || command -v python)\n"
        'if [ -z "$py" ]; then exec cat "$mounted"; fi\n'
        f'exec "$py" -S -E - {cm} {ns} "$sa" "$d" "$mounted" <<\'ETOPERATOR_PY\'\n'
        f"{_WATCHER.strip()}\n"
        "ETOPERATOR_PY\n"
    )


def config_map(
    job: str,
    namespace: str,
    owner: Owner,
    hosts: Sequence[str],
    slots: int,
    data: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`data`: the runtime's (builders/runtimes.py), else Horovod's for `hosts`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(naming.config_map_name(job), namespace, owner, naming.job_labels(job)),
        "data": data if data is not None else config_data(job, namespace, hosts, slots),
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
