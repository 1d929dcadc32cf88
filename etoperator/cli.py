"""`etoperator run`: a thin CLI over `kopf run` with the operator's own flags."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="etoperator", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable); default: all namespaces",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    run.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here")
    run.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint URL ('' to disable)",
    )
    run.add_argument(
        "--no-ssh-checks",
        action="store_true",
        help="count a Running worker as ready (when the operator cannot reach pods)",
    )
    run.add_argument("--ssh-port", type=int, default=22)
    operating_options(run)
    return p


def operating_options(run: argparse.ArgumentParser) -> None:
    """How it runs: preemption, sizes, its replicas, passes, logs."""
    run.add_argument(
        "--no-node-watch", action="store_true", help="do not watch nodes for preemption taints"
    )
    run.add_argument(
        "--preemption-taint",
        action="append",
        help="node taint key announcing termination (repeatable)",
    )
    run.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="most workers a job may have (default 1000; the schema allows at most 10000)",
    )
    run.add_argument(
        "--leader-election",
        action="store_true",
        help="run as one of several replicas: only the holder of the Lease acts",
    )
    run.add_argument(
        "--resync", type=float, default=None, help="seconds between passes of a quiet job (60)"
    )
    run.add_argument("--lease-namespace", help="where the Lease lives (default: the pod's)")
    run.add_argument("--log-format", choices=("text", "json"), default="text")
    run.add_argument("-v", "--verbose", action="store_true")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.update(settings_env(args))
    if problem := patterns_unfollowable(args.namespace, args.kubeconfig):
        print(f"etoperator: {problem}", file=sys.stderr)
        return 2
    import kopf
    from kopf._core.engines.peering import Identity  # not re-exported by kopf

    import etoperator.handlers
    from etoperator import watchlines
    from etoperator.settings import own_identity

    watchlines.install()

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    quiet_logs()
    asyncio.run(
        _operate(
            kopf.operator(
                stop_flag=etoperator.handlers.STOP,
                standalone=True,
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                liveness_endpoint=args.liveness or None,
                # kopf would ask the user database, which has no entry for deploy/'s uid.
                identity=Identity(own_identity(os.environ)),
            )
        )
    )
    return 0


def settings_env(args: argparse.Namespace) -> dict[str, str]:
    """The options as the ETOPERATOR_* variables settings.py reads (an option not given
    leaves its variable as the environment has it)."""
    env = {
        "ETOPERATOR_SSH_CHECKS": "0" if args.no_ssh_checks else "1",
        "ETOPERATOR_SSH_PORT": str(args.ssh_port),
        "ETOPERATOR_METRICS_PORT": str(args.metrics_port),
        "ETOPERATOR_WATCH_NODES": "0" if args.no_node_watch else "1",
    }
    if args.preemption_taint is not None:
        env["ETOPERATOR_PREEMPTION_TAINTS"] = ",".join(args.preemption_taint)
    if args.max_workers is not None:
        env["ETOPERATOR_MAX_WORKERS"] = str(args.max_workers)
    if args.resync is not None:
        env["ETOPERATOR_RESYNC"] = str(args.resync)
    if args.leader_election:
        env["ETOPERATOR_LEADER_ELECTION"] = "1"
    if args.namespace:
        env["ETOPERATOR_NAMESPACES"] = ",".join(args.namespace)
    if args.lease_namespace:
        env["ETOPERATOR_LEASE_NAMESPACE"] = args.lease_namespace
    if args.kubeconfig:
        env["KUBECONFIG"] = env["ETOPERATOR_KUBECONFIG"] = args.kubeconfig
    return env


def patterns_unfollowable(chosen: list[str], kubeconfig: str | None) -> str | None:
    """Why the namespaces `-n` chose cannot be followed, if they cannot: a pattern has kopf
    list and watch namespaces to find those it matches, and without that right it retries the
    list for ever and serves nothing, saying only "forbidden" now and then. Not asked (None)
    when every name is exact, or when the apiserver does not answer (kopf will retry)."""
    from etoperator import kube
    from etoperator.settings import is_pattern

    patterns = [n for n in chosen if is_pattern(n)]
    if not patterns:
        return None
    try:
        client = kube.Kube(kube.load_config(kubeconfig, connections=1))
        missing = [verb for verb in ("list", "watch") if not client.may(verb, "namespaces")]
    except kube.ApiError:
        return None
    if not missing:
        return None
    return (
        f"-n {' '.join(patterns)}: a pattern makes the operator follow the namespaces it "
        f"matches, which needs {' and '.join(missing)} on namespaces cluster-wide, and this "
        "account may not; grant them (a ClusterRole rule: resources [namespaces], verbs "
        "[list, watch]) or name the namespaces exactly"
    )


# Loggers that speak at INFO of what is routine: kopf of every event handler run and every
# liveness probe ("Activity 'jobs' succeeded."), aiohttp of every probe's request, the clients of
# their connections. Our own loggers say what matters; their warnings still come through.
NOISY = ("kopf.objects", "kopf.activities.probe", "aiohttp.access", "kubernetes", "paramiko",
         "urllib3")  # fmt: skip


def quiet_logs() -> None:
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def _operate(operator: Coroutine[Any, Any, None]) -> None:
    """kopf, with SIGTERM ours (SIGINT stays kopf's): the Lease is handed over before kopf
    winds down (etoperator.handlers.hand_over), then kopf's stop flag is raised. kopf adds
    its own SIGTERM handler as it starts, when it may already be leading; that one is not
    added (a race to replace it after the fact was lost while start-up held the loop)."""
    import etoperator.handlers

    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []  # kept while they run
    loop.add_signal_handler(
        signal.SIGTERM, lambda: tasks.append(asyncio.create_task(etoperator.handlers.hand_over()))
    )
    add = loop.add_signal_handler

    def add_unless_sigterm(sig: int, callback: Callable[..., object], *args: Any) -> None:
        if sig != signal.SIGTERM:
            add(sig, callback, *args)

    loop.add_signal_handler = add_unless_sigterm  # type: ignore[method-assign,assignment]
    await operator


if __name__ == "__main__":
    sys.exit(main())
