"""The operator where it meets the machine it runs on."""

from __future__ import annotations

import getpass
import os
import pwd

import pytest

from etoperator.settings import own_identity


def test_identity_needs_no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/ runs the operator as uid 65532, which the image's /etc/passwd does not list (as
    in python:3.11-slim): the identity kopf needs must not come from the user database."""

    def no_such_user(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_such_user)
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME", "POD_NAME"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(KeyError):
        getpass.getuser()  # what kopf would call without an identity
    assert own_identity(os.environ)
    monkeypatch.setenv("POD_NAME", "etoperator-7d9f-abcde")
    assert own_identity(os.environ) == "etoperator-7d9f-abcde"
