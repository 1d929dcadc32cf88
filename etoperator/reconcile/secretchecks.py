"""The Secrets a job names that are not its own: the operator does not watch them, so a pass
reads them, at most every few minutes while all is well and on every pass while not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec, template_secrets
from etoperator.builders import ssh
from etoperator.clock import utcnow
from etoperator.kube import Kube
from etoperator.reconcile.state import USER_SECRET_RECHECK, job_id


@dataclass
class SecretChecks:
    kube: Kube
    clock: Callable[[], datetime] = utcnow
    _user: dict[str, datetime] = field(default_factory=dict)
    _templates: dict[str, datetime] = field(default_factory=dict)

    def forget(self, prefix: str) -> None:
        for memo in (self._user, self._templates):
            for k in [k for k in memo if k.startswith(prefix)]:
                memo.pop(k)

    def problems(self, spec: JobSpec) -> list[str]:
        """What is wrong with the Secrets the job names: its annotation's, its templates'."""
        found = self.check_user_secret(spec) if spec.ssh_secret else []
        return found + self.check_template_secrets(spec)

    def user_secret(self, spec: JobSpec) -> dict[str, Any] | None:
        """The Secret the job's annotation names (not the job's own, so not watched)."""
        assert spec.ssh_secret is not None
        return self.kube.get("Secret", spec.namespace, spec.ssh_secret)

    def check_user_secret(self, spec: JobSpec) -> list[str]:
        """The Secret the annotation names: not the job's own, so not watched; read again at
        most every few minutes (and whenever it was found wanting)."""
        jid = job_id(spec.namespace, spec.name, spec.uid)
        return self._rechecked(self._user, jid, lambda: self._user_secret_problems(spec))

    def _user_secret_problems(self, spec: JobSpec) -> list[str]:
        secret, name = self.user_secret(spec), spec.ssh_secret
        problems = []
        if secret is None:
            problems.append(f"SSH Secret {name} named by the annotation is missing")
        elif ssh.missing_keys(secret):
            problems.append(f"SSH Secret {name} lacks {', '.join(ssh.missing_keys(secret))}")
        elif other := ssh.other_job(secret, spec.uid):
            problems.append(
                f"SSH Secret {name} belongs to TrainingJob {other}: a job may only name a "
                "Secret of its own (its key opens that job's workers)"
            )
        return problems

    def _rechecked(
        self, memo: dict[str, datetime], jid: str, check: Callable[[], list[str]]
    ) -> list[str]:
        """`check` again at most every few minutes while it finds nothing; every time while it
        does (what it reads is not watched)."""
        checked = memo.get(jid)
        if checked and (self.clock() - checked).total_seconds() < USER_SECRET_RECHECK:
            return []
        problems = check()
        if problems:
            memo.pop(jid, None)
        else:
            memo[jid] = self.clock()
        return problems

    def check_template_secrets(self, spec: JobSpec) -> list[str]:
        """A Secret the operator made for another job (its private key opens that job's
        workers) is never mounted into this job's pods, whichever field of a template names
        it. Read like the annotation's Secret: at most every few minutes while all is well."""
        jid = job_id(spec.namespace, spec.name, spec.uid)
        named = [(at, n) for at, n in template_secrets(spec) if n != naming.secret_name(spec.name)]
        if not named:
            return []
        return self._rechecked(self._templates, jid, lambda: self._foreign_keys(spec, named))

    def _foreign_keys(self, spec: JobSpec, named: list[tuple[str, str]]) -> list[str]:
        problems = []
        for at, name in named:
            secret = self.kube.get("Secret", spec.namespace, name)
            if secret is not None and (other := ssh.other_job(secret, spec.uid)):
                problems.append(
                    f"{at} names Secret {name}, TrainingJob {other}'s SSH key: a job's pods may "
                    "mount no other job's key"
                )
        return problems
