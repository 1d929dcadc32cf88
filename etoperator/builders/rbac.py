"""The launcher's service account and what it needs: reading and watching its ConfigMap (a
list or watch with a metadata.name field selector is authorized by name); a torchrun
launcher also reads its own pod (whether it is being deleted: rendezvous.py)."""

from __future__ import annotations

from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.builders.common import Owner, metadata
from etoperator.builders.pods import launcher_service_account


def launcher_account(job: str, namespace: str, owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(
            naming.launcher_sa_name(job), namespace, owner, naming.job_labels(job)
        ),
    }


def launcher_role(job: str, namespace: str, owner: Owner, own_pod: bool) -> dict[str, Any]:
    rules = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],  # plural: the singular grants nothing
            "resourceNames": [naming.config_map_name(job)],
            "verbs": ["get", "list", "watch"],
        }
    ]
    if own_pod:
        pod = [naming.launcher_name(job)]
        rules.append({"apiGroups": [""], "resources": ["pods"], "resourceNames": pod,
                      "verbs": ["get"]})  # fmt: skip
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(
            naming.launcher_sa_name(job), namespace, owner, naming.job_labels(job)
        ),
        "rules": rules,
    }


def launcher_binding(job: str, namespace: str, owner: Owner, account: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(
            naming.launcher_sa_name(job), namespace, owner, naming.job_labels(job)
        ),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": naming.launcher_sa_name(job),
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


def launcher_rbac(spec: JobSpec, owner: Owner) -> list[dict[str, Any]]:
    """What lets the launcher read its host list: the account (unless the template names its
    own), the Role and the binding."""
    account = launcher_service_account(spec, spec.launcher.template)
    wanted = [
        launcher_role(spec.name, spec.namespace, owner, spec.torchrun),
        launcher_binding(spec.name, spec.namespace, owner, account),
    ]
    if account == naming.launcher_sa_name(spec.name):
        wanted.insert(0, launcher_account(spec.name, spec.namespace, owner))
    return wanted
