"""The operator's wiring, in one place: settings read once, every part built once at start-up
and handed to what needs it, and which watch events wake which job's reconcile loop.

Run with `etoperator run ...` or `kopf run -m etoperator.handlers --standalone`; settings come
from the CLI or from ETOPERATOR_* environment variables (see etoperator/settings.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from etoperator import cache, kube, metrics, naming
from etoperator.api.statuses import JobStatus
from etoperator.leader import LeaderElection
from etoperator.reconcile.job import REQUEST_THREADS, JobReconciler
from etoperator.runtime import Runtime
from etoperator.settings import Settings
from etoperator.sshcheck import SSHProber

log = logging.getLogger(__name__)
RBAC_GROUP = "rbac.authorization.k8s.io"
# kopf's requests (the watches among them) are retried 0.5, 1, then every 2 s for 3 minutes:
# after an apiserver restart the watches resume within 2 s of its return (kopf's default backs
# off 1, 1, 2, 3, 5, 8, 13, 21 s, then gives up).
RETRY_BACKOFFS = (0.5, 1.0, *([2.0] * 90))
# Read once, here: which handlers exist (the node watch) depends on them, and start-up builds
# every part from them.
SETTINGS = Settings.from_env()


def runtime(memo: Any) -> Runtime:
    """The operator's runtime, kept in kopf's memo (set at start-up)."""
    return memo.rt  # type: ignore[no-any-return]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    cfg = SETTINGS
    configure_kopf(settings, cfg)
    # A connection for every thread that may make a request at once (SSH probes make none).
    api = kube.load_config(cfg.kubeconfig, connections=cfg.workers + REQUEST_THREADS)
    api.user_agent = f"etoperator/{cfg.identity}"  # which replica made a request (audit logs)
    tainted: set[str] = set()  # nodes about to be taken away: the node watch fills it
    prober = SSHProber(port=cfg.ssh_port, timeout=cfg.ssh_timeout)
    memo.prober = prober  # its connections to workers are closed at the stop
    memo.sweeping = asyncio.create_task(prober.sweeping())  # and those left idle, meanwhile
    reconciler = JobReconciler.build(
        kube.Kube(api),
        prober=prober,
        ssh_checks=cfg.ssh_checks,
        max_workers=cfg.max_workers,
        own_account=cfg.own_account,
        probe_pool=concurrent.futures.ThreadPoolExecutor(cfg.workers, "etoperator-ssh"),
        tainted_nodes=lambda: set(tainted),
    )
    rt = Runtime(
        reconciler,
        workers=cfg.workers,
        tainted=tainted,
        taint_keys=set(cfg.preemption_taints),
        resync=cfg.resync,
    )
    memo.rt = rt
    MEMO[:] = [memo]
    if cfg.leader_election:
        election = LeaderElection.connect(cfg.kubeconfig, cfg.lease_namespace, cfg.identity)
        rt.leading = election.leading
        memo.elector = election
        # Kept in the memo, so that the tasks are not collected while they run.
        memo.election = [asyncio.create_task(election.run()), asyncio.create_task(rt.lead())]
        memo.election[0].add_done_callback(lambda task: _election_ended(task, election))
    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port)
    log.info("etoperator started %s", cfg.describe())


def configure_kopf(settings: kopf.OperatorSettings, cfg: Settings) -> None:
    """How kopf stores its progress, what it watches (ours only) and its timeouts."""
    settings.persistence.finalizer = f"{naming.ANN_PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=naming.ANN_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.ANN_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # our own events only: a standby posts nothing
    # Filtered by the apiserver, not here: the operator never receives other pods of a cluster.
    ours = f"{naming.LABEL_GROUP}={naming.GROUP}"
    for plural in ("pods", "configmaps", "secrets", "services", "serviceaccounts"):
        settings.watching.label_selectors["", "v1", plural] = ours
    for plural in ("roles", "rolebindings"):
        settings.watching.label_selectors[RBAC_GROUP, "v1", plural] = ours
    settings.watching.label_selectors[naming.KUEUE_GROUP, naming.KUEUE_VERSION, "workloads"] = ours
    settings.watching.label_selectors[
        naming.SCHEDULING_GROUP, naming.SCHEDULING_VERSION, "podgroups"
    ] = ours
    settings.watching.server_timeout = cfg.watch_timeout
    settings.watching.client_timeout = cfg.watch_timeout + 10
    settings.networking.request_timeout = 30
    settings.networking.error_backoffs = RETRY_BACKOFFS
    # Chosen namespaces named exactly: kopf would list every namespace to find them, which an
    # install confined to them may not do (403, retried for minutes before kopf falls back).
    settings.scanning.disabled = cfg.exact_namespaces
    # On SIGTERM kopf gives its event queues this long before the cleanup that releases the
    # Lease (2 s by default): our event handlers only wake job loops, nothing to wait for.
    settings.queueing.exit_timeout = 0.2


def _election_ended(task: asyncio.Task[None], election: LeaderElection) -> None:
    """The election loop never ends while the operator runs: if it does (a bug, a cancel), a
    leader would go on writing with no one renewing its Lease. Stop the process instead."""
    if election.stopping:
        return
    exc = None if task.cancelled() else task.exception()
    log.error("Leader election ended unexpectedly error=%r: stopping", exc)
    election.on_lost()


# The CLI runs kopf with STOP as its stop flag and sends SIGTERM to `hand_over` (cli.py).
STOP = asyncio.Event()
MEMO: list[kopf.Memo] = []  # the operator's memo, once started


async def hand_over() -> None:
    """SIGTERM (a pod deleted, a rollout): hand the Lease over first, then stop kopf. kopf runs
    its cleanup only once its watchers have wound down (2-5 s measured), and the standby would
    wait that long for the Lease."""
    log.info("Signal SIGTERM received: handing over, then stopping")
    if MEMO:
        await stop_acting(MEMO[0])
    STOP.set()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await stop_acting(memo)


async def stop_acting(memo: kopf.Memo) -> None:
    """A graceful stop: no new pass and no new write, the writes already sent end, then the
    Lease is released so the standby takes over at once (instead of after the Lease's
    duration). A pass still in flight makes no write from then on. Twice is once."""
    election: LeaderElection | None = getattr(memo, "elector", None)
    if election is not None:
        election.stop()
    rt = getattr(memo, "rt", None)
    if rt is not None:
        started = time.monotonic()
        for ref in list(rt.tasks):
            rt.forget(ref)
        gate = rt.reconciler.kube.gate
        # Past the Lease's duration the standby takes over anyway: no use waiting longer.
        wait = election.duration if election is not None else LeaderElection.duration
        ended = await asyncio.get_running_loop().run_in_executor(None, gate.close, wait)
        log.info("Writes shut in %.2fs sent_ended=%s", time.monotonic() - started, ended)
    sweeping: asyncio.Task[None] | None = getattr(memo, "sweeping", None)
    if sweeping is not None:
        sweeping.cancel()
    prober: SSHProber | None = getattr(memo, "prober", None)
    if prober is not None:
        prober.close()
    if election is not None:
        await asyncio.get_running_loop().run_in_executor(None, election.release)


@kopf.on.probe(id="jobs")
def probe_jobs(memo: kopf.Memo, **_: Any) -> int:
    return len(runtime(memo).tasks)


# -- the watch caches (cache.py): kopf fills them before any handler runs ---------------------

OURS = {naming.LABEL_GROUP: naming.GROUP}


@kopf.index(naming.GROUP, naming.VERSION, naming.JOB_PLURAL)
def jobs_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace or "", name): cache.slim(naming.JOB_KIND, body)}


def _scaler_key(namespace: str | None, body: kopf.Body) -> tuple[str, str]:
    return (namespace or "", naming.selected_job(body))


@kopf.index(naming.GROUP, naming.VERSION, naming.SCALEOUT_PLURAL)
def scaleouts_index(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {_scaler_key(namespace, body): cache.slim(naming.SCALEOUT_KIND, body)}


@kopf.index(naming.GROUP, naming.VERSION, naming.SCALEIN_PLURAL)
def scaleins_index(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {_scaler_key(namespace, body): cache.slim(naming.SCALEIN_KIND, body)}


# (group, plural, kind) of every child kind a pass reads.
CHILDREN = (
    ("", "pods", "Pod"), ("", "services", "Service"), ("", "configmaps", "ConfigMap"),
    ("", "secrets", "Secret"), ("", "serviceaccounts", "ServiceAccount"),
    (RBAC_GROUP, "roles", "Role"), (RBAC_GROUP, "rolebindings", "RoleBinding"),
)  # fmt: skip


def _child_index(kind: str) -> Any:
    def index(labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
        job = cache.job_of(labels)
        ns = str(body.get("metadata", {}).get("namespace") or "")
        return {(ns, job): cache.slim(kind, body)} if job else None

    return index


for _group, _plural, _kind in CHILDREN:
    kopf.index(_group, "v1", _plural, labels=OURS, id=f"{_plural}_index")(_child_index(_kind))
# Kueue's Workloads of queued jobs: watched only where Kueue's API is served (kopf starts the
# watch when the CRD appears).
kopf.index(
    naming.KUEUE_GROUP, naming.KUEUE_VERSION, "workloads", labels=OURS, id="workloads_index"
)(_child_index(naming.WORKLOAD_KIND))
# Gang jobs' PodGroups, where the Workload API is served (the scheduler says on them why a
# gang waits).
kopf.index(
    naming.SCHEDULING_GROUP, naming.SCHEDULING_VERSION, "podgroups", labels=OURS,
    id="podgroups_index",
)(_child_index(naming.POD_GROUP_KIND))  # fmt: skip


def _attach(rt: Runtime, indexes: dict[str, Any]) -> None:
    """The pass reads the caches through the runtime (kopf hands indexes to handlers only)."""
    if rt.observe is None:
        rt.observe = cache.Indexes(
            jobs=indexes["jobs_index"],
            children=[indexes[f"{plural}_index"] for _, plural, _ in CHILDREN]
            + [indexes["workloads_index"], indexes["podgroups_index"]],
            scalers=[indexes["scaleouts_index"], indexes["scaleins_index"]],
        ).observe


@kopf.on.event(naming.GROUP, naming.VERSION, naming.JOB_PLURAL)
async def job_event(
    type: str, name: str, namespace: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    ref = (namespace or "", name)
    rt = runtime(memo)
    _attach(rt, kwargs)
    if type == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        rt.forget(ref)
        return
    rt.set_phase(ref, JobStatus.from_dict(dict(body.get("status") or {})).phase or "")
    rt.start(ref)


@kopf.on.event("", "v1", "pods", labels={naming.LABEL_GROUP: naming.GROUP})
@kopf.on.event("", "v1", "configmaps", labels={naming.LABEL_GROUP: naming.GROUP})
@kopf.on.event(
    naming.KUEUE_GROUP, naming.KUEUE_VERSION, "workloads", labels={naming.LABEL_GROUP: naming.GROUP}
)
@kopf.on.event(
    naming.SCHEDULING_GROUP, naming.SCHEDULING_VERSION, "podgroups",
    labels={naming.LABEL_GROUP: naming.GROUP},
)  # fmt: skip
async def child_event(
    type: str,
    labels: Mapping[str, str],
    namespace: str | None,
    body: kopf.Body,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A pod, the host-list ConfigMap, the Workload or the PodGroup of a job changed or went:
    its job looks again (an admission, an eviction, the scheduler's word on a gang); a pod
    gone leaves the save it reported (the launcher's, the save handshake)."""
    job = labels.get(naming.LABEL_JOB)
    if job and type == "DELETED" and resource.kind == "Pod":
        runtime(memo).reconciler.observer.note_gone(namespace or "", job, dict(body))
    if job:
        runtime(memo).kick((namespace or "", job))


async def _scaler_event(rt: Runtime, kind: str, name: str, namespace: str, body: kopf.Body) -> None:
    job = naming.selected_job(body)
    if not rt.is_leader():
        return
    if job and rt.has((namespace, job)):
        rt.kick((namespace, job))
        return
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(
            rt.pool, rt.reconciler.reconcile_orphan_scaler, kind, namespace, name
        )
    except (kube.ApiError, kube.Conflict) as exc:
        # Looked at again at its next event or resync; never a handler's traceback.
        log.warning("Scaler not handled kind=%s namespace=%s name=%s error=%s", kind, namespace,
                    name, exc)  # fmt: skip


@kopf.on.event("", "v1", "secrets", labels={naming.LABEL_GROUP: naming.GROUP})
async def secret_event(
    type: str, labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """The job's SSH Secret changed or went: look again now, not at the next full check."""
    job = labels.get(naming.LABEL_JOB)
    if job and type in ("MODIFIED", "DELETED"):
        rt = runtime(memo)
        rt.reconciler.child_changed(namespace or "", job, "Secret", type == "DELETED")
        rt.kick((namespace or "", job))


@kopf.on.event("", "v1", "services", labels={naming.LABEL_GROUP: naming.GROUP})
@kopf.on.event("", "v1", "serviceaccounts", labels={naming.LABEL_GROUP: naming.GROUP})
@kopf.on.event(RBAC_GROUP, "v1", "roles", labels={naming.LABEL_GROUP: naming.GROUP})
@kopf.on.event(RBAC_GROUP, "v1", "rolebindings", labels={naming.LABEL_GROUP: naming.GROUP})
async def owned_event(
    type: str,
    labels: Mapping[str, str],
    namespace: str | None,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """A worker Service or the launcher's account, Role or binding went: put it back now. A
    Role changed: its rules are checked now."""
    job = labels.get(naming.LABEL_JOB)
    if job and type == "DELETED":
        rt = runtime(memo)
        rt.reconciler.child_changed(namespace or "", job, resource.kind or "", deleted=True)
        rt.kick((namespace or "", job))
    elif job and type == "MODIFIED" and resource.kind == "Role":
        runtime(memo).kick((namespace or "", job))


@kopf.on.event(naming.GROUP, naming.VERSION, naming.SCALEOUT_PLURAL)
@kopf.on.event(naming.GROUP, naming.VERSION, naming.SCALEIN_PLURAL)
async def scaler_event(
    type: str,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    if not namespace:
        return
    if type == "DELETED":  # its job looks now: a running scale is undone, its slice goes
        rt, job = runtime(memo), naming.selected_job(body)
        if job and rt.is_leader() and rt.has((namespace, job)):
            rt.kick((namespace, job))
        return
    kind = (
        naming.SCALEOUT_KIND if resource.plural == naming.SCALEOUT_PLURAL else (naming.SCALEIN_KIND)
    )
    await _scaler_event(runtime(memo), kind, name, namespace, body)


async def node_event(type: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Spot/preemption notices: a node tainted for termination takes its workers with it."""
    rt = runtime(memo)
    taints = {t.get("key") for t in (body.get("spec") or {}).get("taints") or []}
    doomed = type != "DELETED" and bool(taints & rt.taint_keys)
    if doomed != (name in rt.tainted):
        if doomed:
            log.warning("Node tainted for termination node=%s (its workers leave their jobs)", name)
            rt.tainted.add(name)
        else:
            rt.tainted.discard(name)
        rt.kick_all()


# Registered only when switched on: off, there is no node watch at all (nor a need for its RBAC).
if SETTINGS.watch_nodes:
    kopf.on.event("", "v1", "nodes")(node_event)
