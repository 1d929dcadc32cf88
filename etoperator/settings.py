"""Operator settings: CLI flags become ETOPERATOR_* variables, read once at start-up."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from etoperator.api.fields import DEFAULT_MAX_WORKERS, MAX_WORKERS

# Taints that cloud providers and node-termination handlers put on a node about to go away.
DEFAULT_PREEMPTION_TAINTS = (
    "cloud.google.com/impending-node-termination",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/rebalance-recommendation",
    "karpenter.sh/disrupted",
    "ToBeDeletedByClusterAutoscaler",
)


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None
    ssh_checks: bool
    ssh_port: int
    ssh_timeout: float
    metrics_port: int
    workers: int
    watch_timeout: int
    watch_nodes: bool
    preemption_taints: tuple[str, ...]
    max_workers: int
    leader_election: bool
    resync: float
    lease_namespace: str
    identity: str
    namespaces: tuple[str, ...] = ()  # chosen namespaces (-n); none: all of them
    # The operator's own ServiceAccount ("<namespace>/<name>"): never given to a pod it makes.
    own_account: str = ""

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        taints = env.get("ETOPERATOR_PREEMPTION_TAINTS")
        return cls(
            kubeconfig=env.get("ETOPERATOR_KUBECONFIG") or None,
            ssh_checks=_bool("ETOPERATOR_SSH_CHECKS", True),
            ssh_port=int(env.get("ETOPERATOR_SSH_PORT", "22")),
            ssh_timeout=float(env.get("ETOPERATOR_SSH_TIMEOUT", "3")),
            metrics_port=int(env.get("ETOPERATOR_METRICS_PORT", "0")),
            workers=int(env.get("ETOPERATOR_WORKERS", "16")),
            watch_timeout=int(env.get("ETOPERATOR_WATCH_TIMEOUT", "300")),
            watch_nodes=_bool("ETOPERATOR_WATCH_NODES", True),
            preemption_taints=tuple(t for t in taints.split(",") if t)
            if taints is not None
            else DEFAULT_PREEMPTION_TAINTS,
            max_workers=min(
                MAX_WORKERS, int(env.get("ETOPERATOR_MAX_WORKERS", DEFAULT_MAX_WORKERS))
            ),
            leader_election=_bool("ETOPERATOR_LEADER_ELECTION", False),
            resync=float(env.get("ETOPERATOR_RESYNC", "60")),
            lease_namespace=env.get("ETOPERATOR_LEASE_NAMESPACE")
            or env.get("POD_NAMESPACE")
            or "etoperator-system",
            identity=own_identity(env),
            namespaces=tuple(n for n in env.get("ETOPERATOR_NAMESPACES", "").split(",") if n),
            own_account=env.get("ETOPERATOR_SERVICE_ACCOUNT", ""),
        )

    @property
    def exact_namespaces(self) -> bool:
        """Chosen namespaces, all named exactly (no pattern): nothing to discover."""
        return bool(self.namespaces) and not any(map(is_pattern, self.namespaces))

    def describe(self) -> str:
        return (
            f"ssh_checks={self.ssh_checks} ssh_port={self.ssh_port} "
            f"metrics_port={self.metrics_port or 'off'} watch_nodes={self.watch_nodes} "
            f"preemption_taints={','.join(self.preemption_taints) or 'none'} "
            f"max_workers={self.max_workers} "
            f"leader_election={self.leader_election} identity={self.identity}"
        )


def is_pattern(namespace: str) -> bool:
    """A `-n` value kopf reads as a pattern (a glob, or a negation), not a name."""
    return bool(set(namespace) & set("*?[]!"))


def own_identity(env: Mapping[str, str]) -> str:
    """Who this replica is (to kopf and in the Lease): the pod's name, which deploy/ passes in,
    else host and pid. Never the user's name: the image's uid need not be in /etc/passwd."""
    return env.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
