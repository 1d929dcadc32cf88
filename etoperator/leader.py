"""Leader election over a coordination.k8s.io Lease, as controller-runtime does it.

Replicas of the operator all watch (their caches stay warm); only the holder of the Lease runs
job loops and writes. The holder renews every `retry` seconds; a standby takes the Lease over
once it has seen no renewal for `duration` seconds (measured on its own monotonic clock, so
clock skew between nodes does not matter). A leader that cannot renew within `deadline` stops
the process: a replica that may have lost the Lease must not write again (the Deployment
starts it anew, as a standby).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from etoperator.clock import iso_micro, utcnow
from etoperator.kube import AlreadyExists, ApiError, Conflict, Kube

log = logging.getLogger(__name__)
LEASE = "Lease"


@dataclass
class LeaderElection:
    kube: Kube
    namespace: str
    identity: str
    name: str = "etoperator"
    duration: float = 10.0  # seconds without renewal before a standby takes over
    deadline: float = 8.0  # a leader that cannot renew for this long steps down
    retry: float = 2.0
    on_lost: Callable[[], None] = field(default=lambda: os._exit(1))
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    _seen: tuple[Any, ...] = ()  # (holder, renewTime) last observed
    _seen_at: float = 0.0
    _renewed_at: float = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(None, self.step)
            except (ApiError, OSError) as exc:
                log.warning("Lease not reachable name=%s error=%s", self.name, exc)
            if self.leading.is_set() and time.monotonic() - self._renewed_at > self.deadline:
                log.error(
                    "Lease lost name=%s: stopping so as never to write as a standby", self.name
                )
                self.on_lost()
                return
            await asyncio.sleep(self.retry)

    def step(self) -> None:
        """One look at the Lease: create it, renew it, take it over, or wait."""
        lease = self.kube.get(LEASE, self.namespace, self.name)
        if lease is None:
            self._try(lambda: self.kube.create(self._lease()))
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        now = time.monotonic()
        if (holder, spec.get("renewTime")) != self._seen:
            self._seen, self._seen_at = (holder, spec.get("renewTime")), now
        expired = now - self._seen_at > float(spec.get("leaseDurationSeconds") or self.duration)
        if holder == self.identity or not holder or expired:
            self._try(lambda: self._claim(lease, holder))
        elif self.leading.is_set():
            log.error("Lease taken by %s: stopping", holder)
            self.on_lost()

    def _claim(self, lease: dict[str, Any], holder: str | None) -> None:
        spec = dict(lease.get("spec") or {})
        now = iso_micro(utcnow())
        if holder != self.identity:
            spec.update(
                holderIdentity=self.identity,
                acquireTime=now,
                leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
            )
        spec.update(renewTime=now, leaseDurationSeconds=int(self.duration))
        meta = {"resourceVersion": lease["metadata"]["resourceVersion"]}
        self.kube.patch(LEASE, self.namespace, self.name, {"metadata": meta, "spec": spec})

    def _try(self, write: Callable[[], object]) -> None:
        try:
            write()
        except (Conflict, AlreadyExists):
            return  # another replica wrote first: look again next time
        self._renewed_at = time.monotonic()
        if not self.leading.is_set():
            log.info("Leading name=%s identity=%s", self.name, self.identity)
            self.leading.set()

    def _lease(self) -> dict[str, Any]:
        now = iso_micro(utcnow())
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": LEASE,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
