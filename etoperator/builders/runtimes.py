"""The seam between a job and what trains in it: everything that differs between Horovod
(horovodrun in the launcher, reaching sshd on each worker) and Torchrun (torchrun's elastic
agent on each worker, meeting at a rendezvous the launcher holds). The planner, the scalers,
Kueue and gangs see one job; they ask the job's runtime only what is here. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders import config, pods, torchrun
from etoperator.builders import workload as wl
from etoperator.builders.common import ANYWHERE, Owner, Placement
from etoperator.builders.volumes import launcher_saves, mount_shared


class TrainingRuntime(Protocol):
    name: str
    # The operator asks each worker over SSH whether it is ready and what trains on it; else a
    # running worker is ready, and a leaving one takes itself out (its preStop hook).
    probes: bool
    # The launcher is made with the first workers (they wait for it), not once they are ready.
    launcher_first: bool
    ssh: bool  # its pods need the job's SSH key pair (a Secret made); torchrun's meet otherwise
    # A whole stop (suspension, eviction) deletes the launcher first (its preStop asks the
    # training to save) and the running workers once it is gone, at once: deleted with it,
    # their preStop waits for the training to leave them, which a run saved for its stop
    # never does (it holds). torchrun's pods go at once: each worker's leave waits for the
    # training's save (its report) before the kubelet's SIGTERM, which saves too.
    launcher_stops_first: bool
    ready_words: tuple[str, str]  # what WorkersReady says the listed worker(s) do: one, many

    def worker_pod(
        self, spec: JobSpec, owner: Owner, index: int, run: int, secret: tuple[str, frozenset[str]],
        placement: Placement = ANYWHERE,
    ) -> dict[str, Any]: ...  # fmt: skip

    def launcher(
        self, spec: JobSpec, owner: Owner, run: int, secret: tuple[str, frozenset[str]],
        size: int, placement: Placement = ANYWHERE,
    ) -> list[dict[str, Any]]: ...  # fmt: skip

    def config_data(self, spec: JobSpec, hosts: Sequence[str]) -> dict[str, str]: ...

    def services(self, spec: JobSpec) -> tuple[str, ...]:
        """Services of the job beside the workers' own."""
        ...


class Horovod:
    name = "Horovod"
    probes = True
    launcher_first = False
    ssh = True
    launcher_stops_first = True
    ready_words = ("accepts the job's SSH key", "accept the job's SSH key")

    def worker_pod(
        self, spec: JobSpec, owner: Owner, index: int, run: int, secret: tuple[str, frozenset[str]],
        placement: Placement = ANYWHERE,
    ) -> dict[str, Any]:  # fmt: skip
        pod = pods.worker_pod(spec, owner, index, secret[0], secret[1], placement)
        return mount_shared(spec, pod)

    def launcher(
        self, spec: JobSpec, owner: Owner, run: int, secret: tuple[str, frozenset[str]],
        size: int, placement: Placement = ANYWHERE,
    ) -> list[dict[str, Any]]:  # fmt: skip
        pod = pods.launcher_pod(spec, owner, secret[0], secret[1], run, placement)
        pods.start_with(pod, size * spec.slots_per_worker)
        return [launcher_saves(spec, pod)]

    def config_data(self, spec: JobSpec, hosts: Sequence[str]) -> dict[str, str]:
        return config.config_data(spec.name, spec.namespace, hosts, spec.slots_per_worker)

    def services(self, spec: JobSpec) -> tuple[str, ...]:
        return ()


class Torchrun:
    name = "Torchrun"
    probes = False
    launcher_first = True
    ssh = False
    launcher_stops_first = False
    ready_words = ("runs torchrun's agent", "run torchrun's agent")

    def worker_pod(
        self, spec: JobSpec, owner: Owner, index: int, run: int, secret: tuple[str, frozenset[str]],
        placement: Placement = ANYWHERE,
    ) -> dict[str, Any]:  # fmt: skip
        pod = torchrun.worker_pod(spec, owner, index, run, placement)  # no SSH key given
        return mount_shared(spec, pod)

    def launcher(
        self, spec: JobSpec, owner: Owner, run: int, secret: tuple[str, frozenset[str]],
        size: int, placement: Placement = ANYWHERE,
    ) -> list[dict[str, Any]]:  # fmt: skip
        account = pods.launcher_service_account(spec, spec.launcher.template)
        return [
            torchrun.rendezvous_service(spec, owner),
            launcher_saves(spec, torchrun.launcher_pod(spec, owner, run, account, placement)),
        ]

    def config_data(self, spec: JobSpec, hosts: Sequence[str]) -> dict[str, str]:
        data = config.config_data(spec.name, spec.namespace, hosts, spec.slots_per_worker)
        shipped = {naming.RENDEZVOUS_KEY: config.RENDEZVOUS, naming.LEAVE_KEY: config.LEAVE}
        return {**data, **shipped, naming.AGENT_KEY: config.AGENT}

    def services(self, spec: JobSpec) -> tuple[str, ...]:
        return (naming.launcher_name(spec.name),)


RUNTIMES: dict[str, TrainingRuntime] = {"Horovod": Horovod(), "Torchrun": Torchrun()}


def of(spec: JobSpec | None) -> TrainingRuntime:
    return RUNTIMES["Torchrun" if spec is not None and spec.torchrun else "Horovod"]


def worker(
    spec: JobSpec, owner: Owner, index: int, run: int, secret: tuple[str, frozenset[str]],
    placement: dict[str, Placement], surplus: bool,
) -> dict[str, Any]:  # fmt: skip
    """A worker's pod placed as the admission it runs under says: one made under a queued
    job's surplus by the surplus's flavors, and labelled so (what Kueue takes back first)."""
    where = placement.get(wl.WORKER_SET, ANYWHERE)
    if surplus:
        where = placement.get(wl.SURPLUS_SET, where)
    return wl.admitted_under(of(spec).worker_pod(spec, owner, index, run, secret, where), surplus)
