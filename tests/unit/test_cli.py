"""The operator where it meets the machine it runs on."""

from __future__ import annotations

import getpass
import logging
import os
import pwd

import pytest

from etoperator import cli
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


def test_routine_probes_leave_the_log_quiet_and_warnings_come_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every liveness probe made two INFO lines (kopf's activity, aiohttp's access log): 6 a
    minute that buried what the operator had to say."""
    cli.quiet_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger("kopf.activities.probe").info("Activity 'jobs' succeeded.")
        logging.getLogger("aiohttp.access").info('"GET /healthz HTTP/1.1" 200')
        logging.getLogger("etoperator.handlers").info("Scaling job=j")
        logging.getLogger("aiohttp.access").warning("a warning")
    assert [r.getMessage() for r in caplog.records] == ["Scaling job=j", "a warning"]
