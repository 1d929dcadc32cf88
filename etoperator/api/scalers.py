"""A ScaleOut's or ScaleIn's parsed, defaulted spec, and the checks only the operator can make
(the CRD schema rejects most bad input first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etoperator import naming
from etoperator.api import fields as f
from etoperator.api.fields import MAX_WORKERS, InvalidSpec
from etoperator.api.models import _ENV_NAME, _dict


def _to_delete(to_delete: Any) -> tuple[int | None, tuple[str, ...] | None]:
    """A ScaleIn's victims: by count, or by name (each a valid pod name, none twice)."""
    if not isinstance(to_delete, dict):
        raise InvalidSpec("spec.toDelete is required: give count or podNames")
    if (to_delete.get("count") is None) == (to_delete.get("podNames") is None):
        raise InvalidSpec("spec.toDelete needs exactly one of count and podNames")
    if to_delete.get("count") is not None:
        return f.DELETE_COUNT.parse(to_delete.get("count")), None
    names = to_delete.get("podNames")
    if not isinstance(names, list) or not names or len(names) > MAX_WORKERS:
        raise InvalidSpec(f"spec.toDelete.podNames must list from 1 to {MAX_WORKERS} pods")
    for n in names:
        if not isinstance(n, str) or not naming.is_dns1123_label(n):
            raise InvalidSpec(f"spec.toDelete.podNames holds an invalid pod name {n!r}")
    if len(set(names)) != len(names):
        raise InvalidSpec("spec.toDelete.podNames lists a pod twice")
    return None, tuple(names)


@dataclass(frozen=True)
class ScalerSpec:
    kind: str
    name: str
    namespace: str
    uid: str
    job: str
    timeout: int
    script: str | None
    env: tuple[tuple[str, str], ...]
    count: int | None
    pod_names: tuple[str, ...] | None
    created: str


# The longest argument Linux passes to a program, its NUL included (32 pages of 4 KiB): the
# scaler's variables reach its script as `env NAME=value` arguments.
MAX_ARG_STRLEN = 131072


def parse_scaler(kind: str, body: dict[str, Any]) -> ScalerSpec:
    """A defaulted ScalerSpec from a ScaleOut or ScaleIn body; InvalidSpec says what is wrong."""
    meta = body.get("metadata", {})
    spec = _dict(body.get("spec"), "spec")
    job = _dict(spec.get("selector"), "spec.selector").get("name")
    if not isinstance(job, str) or not job:
        raise InvalidSpec("spec.selector.name must name a TrainingJob")
    if not naming.is_dns1123_label(job):
        raise InvalidSpec(f"spec.selector.name {job!r} is not a valid TrainingJob name")
    timeout = f.TIMEOUT.parse(spec.get("timeout"))
    assert timeout is not None
    script = spec.get("script")
    if script is not None and (not isinstance(script, str) or not script.startswith("/")):
        raise InvalidSpec("spec.script must be an absolute path inside the launcher")
    env = _env(spec.get("env") or [])
    count: int | None = None
    pod_names: tuple[str, ...] | None = None
    if kind == naming.SCALEOUT_KIND:
        to_add = _dict(spec.get("toAdd"), "spec.toAdd")
        count = f.ADD_COUNT.parse(to_add.get("count"))
        if count is None:
            raise InvalidSpec("spec.toAdd.count is required and must be at least 1")
    else:
        count, pod_names = _to_delete(spec.get("toDelete"))
    return ScalerSpec(
        kind=kind,
        name=meta.get("name", ""),
        namespace=meta.get("namespace", "default"),
        uid=meta.get("uid", ""),
        job=job,
        timeout=timeout,
        script=script,
        env=env,
        count=count,
        pod_names=pod_names,
        created=meta.get("creationTimestamp", ""),
    )


def _env(items: list[Any]) -> tuple[tuple[str, str], ...]:
    """The script's variables: valid names, each `NAME=value` one argument Linux takes."""
    env: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        item = _dict(item, f"spec.env[{i}]")
        ename, value = item.get("name"), item.get("value", "")
        if not isinstance(ename, str) or not _ENV_NAME.match(ename):
            raise InvalidSpec(f"spec.env[{i}].name {ename!r} is not a valid variable name")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidSpec(f"spec.env[{i}].value must be a string without NUL bytes")
        size = len(f"{ename}={value}".encode())
        if size >= MAX_ARG_STRLEN:
            raise InvalidSpec(
                f"spec.env[{i}] ({ename}) is {size} bytes: the script gets it as one argument, "
                f"and Linux takes at most {MAX_ARG_STRLEN - 1} bytes in one"
            )
        env.append((ename, value))
    return tuple(env)
