"""Leader election over a coordination.k8s.io Lease, as client-go's leaderelection does it.

Replicas of the operator all watch (their caches stay warm); only the holder of the Lease runs
job loops and writes. Every `retry` seconds each replica looks at the Lease; the holder renews
it, a standby takes it over once it has seen no renewal for the Lease's duration (measured on
its own monotonic clock, so clock skew between nodes does not matter).

What keeps two replicas from ever acting at once:
  - every request of the election is bounded (`request_timeout`) and sent once, well below the
    renew deadline (the client's own retries made a look four timeouts long, past it), and a
    look that hangs anyway does not hold up the deadline check;
  - a leader that has not renewed within `deadline` (< `duration`, counted from the moment its
    last successful renewal was *sent*) stops the process before a standby may take over;
  - every error of a look is caught and logged (the client raises transport errors, not only
    API errors, while the server is down), and the loop ending for any reason stops the
    process: an election that silently died would leave a leader writing unchecked;
  - a leader that is stopped gracefully makes no new write, and releases the Lease (holder
    cleared) once the writes it had sent have ended, so the warm standby takes over at its
    next look, about a second later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from etoperator.clock import iso_micro, utcnow
from etoperator.kube import AlreadyExists, ApiError, Conflict, Kube, load_config

log = logging.getLogger(__name__)
LEASE = "Lease"


def _exit() -> None:
    logging.shutdown()
    os._exit(1)


@dataclass
class LeaderElection:
    kube: Kube
    namespace: str
    identity: str
    name: str = "etoperator"
    duration: float = 10.0  # seconds without renewal before a standby takes over
    deadline: float = 7.0  # a leader that cannot renew for this long stops
    retry: float = 1.0  # how often the Lease is looked at
    request_timeout: float = 2.0  # bounds each request, so one look ends well before `deadline`
    on_lost: Callable[[], None] = field(default=_exit)
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    _seen: tuple[Any, ...] = ()  # (holder, renewTime) last observed
    _seen_at: float = 0.0
    _renewed_at: float = 0.0  # when the last successful renewal was sent
    _stopping: bool = False
    _pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "etoperator-lease")
    )

    @classmethod
    def connect(cls, kubeconfig: str | None, namespace: str, identity: str) -> LeaderElection:
        """An election with a client of its own: its Lease is written (released) after the
        passes' writes are shut, and each of its requests is sent once (a look is retried by
        the loop, each second, not by the client behind `request_timeout`)."""
        api = load_config(kubeconfig, connections=2, retries=0)
        api.user_agent = f"etoperator/{identity}"  # which replica made a request (audit logs)
        return cls(Kube(api), namespace, identity)

    async def run(self) -> None:
        """Look at the Lease every `retry` seconds until stopped; never raises."""
        loop = asyncio.get_running_loop()
        look: asyncio.Future[None] | None = None
        while not self._stopping:
            if look is None or look.done():
                look = loop.run_in_executor(self._pool, self.look)
            # The deadline is checked on time even while a look hangs.
            await asyncio.wait({look}, timeout=self.retry)
            if self.lost():
                log.error(
                    "Lease not renewed for %.1fs name=%s: stopping so as never to act beside "
                    "another leader",
                    time.monotonic() - self._renewed_at,
                    self.name,
                )
                self.on_lost()
                return
            if look.done():
                await asyncio.sleep(max(0.0, self.retry - 0.01))

    def lost(self) -> bool:
        return (
            self.leading.is_set()
            and not self._stopping
            and time.monotonic() - self._renewed_at > self.deadline
        )

    def look(self) -> None:
        """One look, every error caught and logged."""
        try:
            self.step()
        except ApiError as exc:
            log.warning("Lease not reachable name=%s error=%s", self.name, exc)
        except Exception:
            log.exception("Lease look failed name=%s", self.name)

    def step(self) -> None:
        """One look at the Lease: create it, renew it, take it over, or wait."""
        sent = time.monotonic()
        lease = self.kube.get(LEASE, self.namespace, self.name, timeout=self.request_timeout)
        if self._stopping:
            return
        if lease is None:
            self._try(sent, lambda: self.kube.create(self._lease(), timeout=self.request_timeout))
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        now = time.monotonic()
        if (holder, spec.get("renewTime")) != self._seen:
            self._seen, self._seen_at = (holder, spec.get("renewTime")), now
        expired = now - self._seen_at > float(spec.get("leaseDurationSeconds") or self.duration)
        if holder == self.identity or not holder or expired:
            self._try(sent, lambda: self._write(lease, holder))
        elif self.leading.is_set():
            log.error("Lease taken by %s: stopping", holder)
            self.on_lost()

    def _write(self, lease: dict[str, Any], holder: str | None, release: bool = False) -> None:
        spec = dict(lease.get("spec") or {})
        now = iso_micro(utcnow())
        if release:
            spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=now)
        else:
            if holder != self.identity:
                spec.update(
                    holderIdentity=self.identity,
                    acquireTime=now,
                    leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
                )
            spec.update(renewTime=now, leaseDurationSeconds=int(self.duration))
        meta = {"resourceVersion": lease["metadata"]["resourceVersion"]}
        self.kube.patch(
            LEASE, self.namespace, self.name, {"metadata": meta, "spec": spec},
            timeout=self.request_timeout,
        )  # fmt: skip

    def _try(self, sent: float, write: Callable[[], object]) -> None:
        try:
            write()
        except (Conflict, AlreadyExists):
            return  # another replica wrote first: look again next time
        self._renewed_at = sent
        if not self.leading.is_set() and not self._stopping:
            log.info("Leading name=%s identity=%s", self.name, self.identity)
            self.leading.set()

    def stop(self) -> None:
        """No more looks or renewals (the loop ends at its next turn)."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    def release(self) -> bool:
        """Give the Lease up, if held: called once this replica has stopped acting, so that a
        standby takes over at its next look instead of after the Lease's duration."""
        self.stop()
        if not self.leading.is_set():
            return False
        self.leading.clear()
        # A look already past its stop check may renew once more between this read and this
        # write: that Conflict only means to read again.
        for _ in range(3):
            try:
                lease = self.kube.get(
                    LEASE, self.namespace, self.name, timeout=self.request_timeout
                )
                spec = (lease or {}).get("spec") or {}
                if lease is None or spec.get("holderIdentity") != self.identity:
                    return False
                self._write(lease, self.identity, release=True)
            except Conflict:
                continue
            except ApiError as exc:
                log.warning("Lease not released name=%s error=%s", self.name, exc)
                return False
            log.info("Lease released name=%s identity=%s", self.name, self.identity)
            return True
        log.warning("Lease not released name=%s error=conflict after conflict", self.name)
        return False

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
