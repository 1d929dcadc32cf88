"""P1-P3: how soon horovodrun's discovery script sees a change (real nodes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.common import Row, Timeline, fmt, in_phase, on_real_nodes, operator_requests
from etoperator import naming
from localcluster.manifests import job, scalein, scaleout
from localcluster.world import (
    Chain,
    World,
    start_chain,
    wait_for,
)

DISCOVERY_WINDOW = 120.0


def discover(c: World, ns: str, name: str, tmp: Path) -> Callable[[], list[str]]:
    """The job's real discover_hosts.sh, run on this machine as the launcher runs it (its
    service account's token, the apiserver's address)."""
    cp = c.local.cp
    assert cp is not None
    cm = c.api.get("ConfigMap", ns, f"{name}-config")
    assert cm is not None
    d = tmp / f"disc-{ns}"
    (d / "sa").mkdir(parents=True, exist_ok=True)
    (d / "discover_hosts.sh").write_text(cm["data"]["discover_hosts.sh"])
    (d / "discover_hosts.sh").chmod(0o755)
    token = c.kubectl("create", "token", f"{name}-launcher", "-n", ns).stdout.strip()
    (d / "sa" / "token").write_text(token)
    shutil.copy(cp.ca, d / "sa" / "ca.crt")
    env = {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": cp.address,  # on real nodes, where pods reach it
        "KUBERNETES_SERVICE_PORT": str(cp.port),
        "ETOPERATOR_SA_DIR": str(d / "sa"),
        "TMPDIR": str(d),
    }

    def run() -> list[str]:
        out = subprocess.run(
            [str(d / "discover_hosts.sh")], capture_output=True, text=True, env=env, timeout=10
        )
        return [line.split(":")[0] for line in out.stdout.splitlines()]

    return run


def gone(name: str, listing: Callable[[], list[str]]) -> bool:
    """`name` is no longer listed, and the others still are (an empty list is a failure)."""
    hosts = listing()
    return bool(hosts) and name not in hosts


def p1_p2_p3(tmp: Path, rounds: int) -> list[Row]:
    """On real nodes, the operator deployed: a 3-worker job (workers with a real sshd, the
    launcher idle: the figures are the operator's), each worker's start and each host list
    change timed from watches."""
    c = start_chain(tmp / "chain")
    try:
        ns = c.new_namespace()
        c.create(on_real_nodes(job("b", replicas=3, maxReplicas=64)), ns)
        wait_for(lambda: c.phase(ns, "b") == "Running", 180, "the job Running")
        disc = discover(c, ns, "b", tmp)
        t0 = time.monotonic()
        # The first call starts the watcher, as at Horovod's start; a call that cannot reach
        # the apiserver prints no host, which would pass for every worker gone.
        assert len(disc()) == 3, "discovery cannot reach the apiserver"
        first = time.monotonic() - t0
        tl = Timeline(c, ns)
        p1 = [p1_round(c, ns, disc) for _ in range(rounds)]
        p2_raw: list[float] = []
        p2_net: list[float] = []
        p3_out: list[float] = []
        p3_del: list[float] = []
        for i in range(rounds):
            raw, net, out, deleted = p2_p3_round(c, ns, tl, i)
            p2_raw.append(raw)
            p2_net.append(net)
            p3_out.append(out)
            p3_del.append(deleted)
        reads, window = discovery_requests(c, ns, "b", disc, tmp / f"disc-{ns}" / "sa")
        return [
            ("P1", "worker failed (seen in the API) -> discover_hosts.sh stops listing it",
             f"{fmt(p1)} (rounds: {', '.join(f'{v:.2f}' for v in p1)})", "<= 1 s"),
            ("P1", "discover_hosts.sh's first call (starts the watcher)", f"{first:.2f}s", ""),
            ("P1", "discovery requests per running job per 10 min, steady (run each second)",
             f"{len(reads) * 600 / window:.1f} ({len(reads)} in {window:.0f} s)", "< 1"),
            ("P2", "ScaleOut -> new host listed (raw)", fmt(p2_raw), ""),
            ("P2", "ScaleOut -> listed, minus pod start (beyond the pod Running)", fmt(p2_net),
             "<= 2 s"),
            ("P3", "ScaleIn -> victim out of the list", fmt(p3_out), "<= 1 s"),
            ("P3", "out of the list -> drained (sshd asked) -> pod deleted", fmt(p3_del),
             "<= 3 s"),
        ]  # fmt: skip
    finally:
        c.stop()


def p1_round(c: Chain, ns: str, disc: Callable[[], list[str]]) -> float:
    """A listed worker's containers killed: from the API showing it Failed until discovery
    drops it; then the job is scaled back to 3 workers."""
    victim = c.hosts(ns, "b")[0]
    c.kill(ns, victim)
    seen = wait_for(partial(in_phase, c, ns, [victim], "Failed"), 60, "the victim Failed", 0.01)
    wait_for(partial(gone, victim, disc), 30, "discovery to drop it", 0.01)
    took = time.monotonic() - seen
    wait_for(lambda: c.job(ns, "b")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 2, 30)
    c.kubectl("scale", "trainingjob", "b", "-n", ns, "--replicas", "3")
    wait_for(lambda: len(c.hosts(ns, "b")) == 3, 120, "3 hosts again")
    return took


def p2_p3_round(c: Chain, ns: str, tl: Timeline, i: int) -> tuple[float, float, float, float]:
    """A ScaleOut +1, then a ScaleIn of the new worker by name: (ScaleOut -> listed, pod
    Running -> listed, ScaleIn -> unlisted, unlisted -> pod deleted)."""
    grow, shrink = f"so-{i}", f"si-{i}"
    t0 = time.monotonic()
    c.create(scaleout(grow, "b", 1), ns)
    wait_for(partial(tl.seen, ("ScaleSucceeded", grow)), 60, "ScaleSucceeded")
    (name,) = c.status(ns, grow, "ScaleOut").get("addPods") or [""]
    wait_for(partial(tl.seen, ("listed", name), ("running", name)), 10, "seen listed")
    raw, net = tl.at["listed", name] - t0, tl.at["listed", name] - tl.at["running", name]
    t0 = time.monotonic()
    c.create(scalein(shrink, "b", pod_names=[name]), ns)
    wait_for(partial(tl.seen, ("unlisted", name), ("deleted", name)), 60, "unlisted, deleted")
    return raw, net, tl.at["unlisted", name] - t0, tl.at["deleted", name] - tl.at["unlisted", name]


def discovery_requests(
    c: World, ns: str, name: str, disc: Callable[[], list[str]], sa: Path
) -> tuple[list[str], float]:
    """Discovery's cost once steady: the script run once a second for DISCOVERY_WINDOW, as
    Horovod runs it; the job's launcher account's requests in that window (the audit log)."""
    cp = c.local.cp
    assert cp is not None
    start = time.time()
    while time.time() < start + DISCOVERY_WINDOW:
        disc()
        time.sleep(1)
    end = time.time()
    marker = f"{cp.url}/api/v1/namespaces/{ns}/configmaps/{naming.config_map_name(name)}?marker=1"
    auth = f"Authorization: Bearer {(sa / 'token').read_text()}"
    subprocess.run(["curl", "-sf", "--cacert", str(sa / "ca.crt"), "-H", auth, marker],
                   check=True, capture_output=True)  # fmt: skip
    # The audit log is written in batches: once the marker is in it, so is the window.
    wait_for(lambda: any("marker=1" in str(e.get("requestURI")) for e in cp.audit()), 10)
    user = f"system:serviceaccount:{ns}:{naming.launcher_sa_name(name)}"
    return operator_requests(c, start, end, user), end - start
