"""The rendezvous of a torchrun job: torch's c10d store, held by the job's launcher pod.

Not imported by the operator: its source is shipped in the job's ConfigMap and run with the
job's own image (it needs torch, which the workers' image has), docs/torchrun.md:
`rendezvous.py serve PORT RUN_ID MIN DISCOVER [REQUEST]`. It hosts the TCPStore every agent
meets at, so a ScaleIn never takes the rendezvous away, and it conducts: a worker leaving on
purpose (its preStop, leave.py) is taken out at once (its agent held first) and the others
told through torch's own "nodes waiting" count (a membership change: no --max-restarts used);
its hook hears so once they stopped their training, which its own would fail if it went
first. A round closes as soon as it holds as many nodes as the host list (DISCOVER prints
it), not after torch's 30 s last call. Once the save handshake's REQUEST is touched the run
stops: leaves change nothing. So too once its own pod is being deleted (a whole stop deletes
the launcher before the workers): a worker's leave can come before the launcher's preStop
touched REQUEST (another node's kubelet), and taken as a membership change it restarted the
training mid-step and the stop saved nothing. Its exit is the run's: 0 once every agent
passed torch's exit barrier, else 1. State edits go through torch's backend with its
compare-and-set token, as its agents' do. What both sides of a leave share is here (leave.py
loads this file)."""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import os
import pickle
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

TICK = 0.1  # seconds between looks at the rendezvous (torchrun's agents look as often)
LEAVES = "etoperator/leaves"  # a counter; leave n is at etoperator/leave/<n>
LEAVE = "etoperator/leave/"
LEFT = "etoperator/left/"
STOPPING = "etoperator/stopping"  # set once the run stops: a leave then changes nothing
STOP_HOLD = 60.0  # seconds a save request holds the run (examples/savepoint.py HOLD_MOST)
MARKER_ADDR = "etoperator.planned-change"
BARRIER = "torchelastic/agent/terminal_state/last_member"  # torch's exit barrier, once passed
SAVES = ".etoperator-saves"  # beside REQUEST: the script saves when asked (naming.SAVE_MARKER)
POD_ENV, NAMESPACE_ENV = "ETOPERATOR_POD", "ETOPERATOR_NAMESPACE"  # the launcher's (fieldRef)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_WITHIN = 1.0  # seconds for the apiserver's answer (a leave waits for it)


def marker() -> Any:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    return _NodeDesc(MARKER_ADDR, 0, 0)


def drop_nodes(state: Any, addr: str) -> bool:
    """Takes every node of `addr` out of the rendezvous state, as torch's own sweep of dead
    nodes does; if a running round had others, a marker waits so that they restart."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _remove_participant_epilogue,
    )

    gone = {n for n in (*state.participants, *state.wait_list, *state.last_heartbeats)}
    gone = {n for n in gone if n.addr == addr}
    if not gone:
        return False
    was_complete = state.complete
    for node in gone:
        state.participants.pop(node, None)
        state.last_heartbeats.pop(node, None)
        state.wait_list.discard(node)
        state.redundancy_list.discard(node)
    # what torch's epilogue reads: min_nodes (a complete round only moves on when empty)
    settings: Any = SimpleNamespace(min_nodes=len(state.participants) + 1)
    _remove_participant_epilogue(state, settings)
    if was_complete and state.complete and state.participants:
        state.wait_list.add(marker())
        state.last_heartbeats[marker()] = datetime.now(UTC)
    return True


def tidy(
    state: Any, marked_round: int | None, hosts: Callable[[], int], min_nodes: int
) -> tuple[bool, bool]:
    """(state changed, marker still out). The marker goes once its round moved on; a round as
    big as the host list closes now (`hosts`, a process, asked only for one that may close)."""
    changed = False
    out = marker() in state.wait_list
    if out and (marked_round is None or state.round != marked_round or not state.complete):
        state.wait_list.discard(marker())
        state.last_heartbeats.pop(marker(), None)
        changed, out = True, False
    now = datetime.now(UTC)
    count = len(state.participants)
    forming = not out and not state.complete and state.deadline is not None
    if forming and count >= max(min_nodes, 1) and state.deadline > now and count == hosts():
        state.deadline = now - timedelta(microseconds=1)
        changed = True
    return changed, out


def count_hosts(discover: str) -> int:
    try:
        out = subprocess.run([discover], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.splitlines() if line.strip()])


def torch_store() -> tuple[Any, Any]:
    """torch's TCPStore and c10d backend, loaded with the cycle collector off and what loading
    made frozen out of its sweeps (torchagent.unswept says why: 2.0 -> 1.4 CPU-s here)."""
    gc.disable()
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d

    gc.freeze()
    gc.enable()
    return TCPStore, c10d


def serve(port: int, run_id: str, min_nodes: int, discover: str, request: str = "-") -> int:
    """DISCOVER "-": the store alone, torch's own timeouts (torchrun as it is). REQUEST: the
    save handshake's file, touched as the run stops; a leave then would restart the others."""
    TCPStore, c10d = torch_store()
    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False)
    backend = c10d.C10dRendezvousBackend(store, run_id)
    print(f"rendezvous {run_id} serving on port {port}", flush=True)
    seen, marked, said, started, stopping = 0, None, "", time.time(), False
    deleted = False  # this launcher's pod is being deleted: the whole run stops
    pending: dict[str, int | None] = {}  # a leaving node: the round its peers still train in
    while True:
        time.sleep(TICK)
        total = store.add(LEAVES, 0)  # leaves asked for so far (the ones since `seen` are new)
        if not (stopping or deleted) and total > seen and saves(request):
            deleted = deleting()  # asked at each leave, before it is taken
        if stopping != (deleted or stops(request, started)):
            stopping = not stopping
            store.set(STOPPING, "1") if stopping else store.delete_key(STOPPING)
            why = " (this launcher is being deleted)" if deleted else ""
            print(f"the run stops: {stopping}{why} (leaves change nothing then)", flush=True)
        got = None if stopping else backend.get_state()
        if got is None:
            continue
        state, token = pickle.loads(got[0]), got[1]
        leaving = [store.get(f"{LEAVE}{n}").decode() for n in range(seen + 1, total + 1)]
        dropped = {addr: drop_nodes(state, addr) for addr in leaving}
        marked = state.round if any(dropped.values()) else marked
        hosts = partial(count_hosts, discover)
        tidied = discover != "-" and tidy(state, marked, hosts, min_nodes)[0]
        changed = any(dropped.values()) or tidied
        written = backend.set_state(pickle.dumps(state), token) if changed else None
        if changed and not (written and written[2]):
            continue  # an agent wrote first: look again
        others = state.complete and bool(state.participants)
        pending.update({a: state.round if d and others else None for a, d in dropped.items()})
        for addr in [a for a, r in pending.items() if r != state.round or not state.complete]:
            store.set(f"{LEFT}{addr}", "1")
            del pending[addr]
        seen = total
        now = describe(state)
        if now != said:
            print(now, flush=True)
            said = now
        if state.closed:
            passed = store.check([f"torch.rendezvous.{run_id}.{state.round}/{BARRIER}"])
            print(f"rendezvous closed; exit barrier {'passed' if passed else 'not passed'}")
            return 0 if passed else 1


def stops(request: str, started: float) -> bool:
    """Asked to save since it started; a request no stop followed (a file touched by hand)
    is over after STOP_HOLD s, as the script's hold is."""
    with contextlib.suppress(OSError):
        asked = os.stat(request).st_mtime if request != "-" else 0.0
        return started < asked > time.time() - STOP_HOLD
    return False


def saves(request: str) -> bool:
    """A save handshake whose script saves when asked: a stop is worth holding leaves for."""
    return request != "-" and os.path.exists(os.path.join(os.path.dirname(request), SAVES))


def deleting() -> bool:
    """This launcher's pod is being deleted (its deletionTimestamp, read from the apiserver,
    not a cache: the delete came before the workers'). False where it cannot tell."""
    pod, ns = os.environ.get(POD_ENV), os.environ.get(NAMESPACE_ENV)
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not (pod and ns and host):
        return False
    port = int(os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
    try:
        ctx = ssl.create_default_context(cafile=os.path.join(SA_DIR, "ca.crt"))
        with open(os.path.join(SA_DIR, "token")) as f:  # re-read: the kubelet rotates it
            token = f.read().strip()
        conn = http.client.HTTPSConnection(host, port, timeout=API_WITHIN, context=ctx)
        with contextlib.closing(conn):
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
            conn.request("GET", f"/api/v1/namespaces/{quote(ns)}/pods/{quote(pod)}", None, headers)
            resp = conn.getresponse()
            got = json.loads(resp.read()) if resp.status == 200 else {}
    except (OSError, ValueError) as failed:
        print(f"could not tell whether this launcher is being deleted: {failed}", flush=True)
        return False
    return bool((got.get("metadata") or {}).get("deletionTimestamp"))


def describe(state: Any) -> str:
    nodes = ",".join(sorted(n.addr for n in state.participants))
    what = "complete" if state.complete else "forming"
    said = f"round {state.round} {what}: {len(state.participants)} nodes [{nodes}]"
    waiting = sorted(n.addr for n in state.wait_list)
    return f"{said}, waiting [{','.join(waiting)}]" if waiting else said


def stop(signum: int, _frame: object) -> None:
    """A container's first process has no default SIGTERM action: it held its pod 30 s."""
    sys.exit(128 + signum)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) in (5, 6):
        signal.signal(signal.SIGTERM, stop)
        return serve(int(argv[1]), argv[2], int(argv[3]), *argv[4:])
    usage = "usage: rendezvous.py serve PORT RUN_ID MIN DISCOVER [REQUEST]"
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
