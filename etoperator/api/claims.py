"""Which Secrets a TrainingJob's pods would be given: the ones its templates name (secret and
projected volumes, each container's env and envFrom, init containers too) and the one its
`arena.kubeflow.org/ssh-secret` annotation names. Read from the raw object, so that any job
(valid or not, of this operator's parsing or not) can be asked whether it names a Secret."""

from __future__ import annotations

from typing import Any

from etoperator import naming


def template_secrets(templates: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, name) of every Secret the templates (by role) name."""
    found = []
    for role, tmpl in templates.items():
        pod = (tmpl.get("spec") if isinstance(tmpl, dict) else None) or {}
        at = f"spec.etReplicaSpecs.{role}.template.spec"
        for i, vol in enumerate(_list(pod, "volumes")):
            if name := _dict(vol, "secret").get("secretName"):
                found.append((f"{at}.volumes[{i}].secret.secretName", str(name)))
            for j, src in enumerate(_list(_dict(vol, "projected"), "sources")):
                if name := _dict(src, "secret").get("name"):
                    found.append((f"{at}.volumes[{i}].projected.sources[{j}].secret", str(name)))
        for kind in ("initContainers", "containers"):
            for i, c in enumerate(_list(pod, kind)):
                for j, env in enumerate(_list(c, "env")):
                    ref = _dict(_dict(env, "valueFrom"), "secretKeyRef")
                    if ref.get("name"):
                        found.append((f"{at}.{kind}[{i}].env[{j}]", str(ref["name"])))
                for j, src in enumerate(_list(c, "envFrom")):
                    if name := _dict(src, "secretRef").get("name"):
                        found.append((f"{at}.{kind}[{i}].envFrom[{j}]", str(name)))
    return found


def job_templates(body: dict[str, Any]) -> dict[str, Any]:
    """The launcher and worker templates of a TrainingJob object, as written."""
    specs = _dict(_dict(body, "spec"), "etReplicaSpecs")
    return {role: _dict(_dict(specs, role), "template") for role in ("launcher", "worker")}


def claims(body: dict[str, Any], secret: str) -> str | None:
    """Where this job names Secret `secret` (a field or the annotation), if it does."""
    annotations = _dict(_dict(body, "metadata"), "annotations")
    if annotations.get(naming.ANN_SSH_SECRET) == secret:
        return f"annotation {naming.ANN_SSH_SECRET}"
    return next((at for at, n in template_secrets(job_templates(body)) if n == secret), None)


def _dict(obj: Any, key: str) -> dict[str, Any]:
    got = obj.get(key) if isinstance(obj, dict) else None
    return got if isinstance(got, dict) else {}


def _list(obj: Any, key: str) -> list[Any]:
    got = obj.get(key) if isinstance(obj, dict) else None
    return [x for x in got if isinstance(x, dict)] if isinstance(got, list) else []
