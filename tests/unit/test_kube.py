"""How an exec's end, as the kubelet tells it, becomes an exit code and a reason."""

from __future__ import annotations

import json

from etoperator.kube import exec_outcome


def test_an_exec_that_ran_gives_its_exit_code() -> None:
    assert exec_outcome(json.dumps({"status": "Success"}), "out") == (0, "out")
    failed = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert exec_outcome(json.dumps(failed), "out") == (3, "out")


def test_an_exec_that_could_not_start_says_why() -> None:
    refused = {
        "status": "Failure",
        "message": 'failed to exec in container: exec: "nope": executable file not found',
    }
    code, why = exec_outcome(json.dumps(refused), "")
    assert code == -1 and 'exec: "nope": executable file not found' in why
    assert exec_outcome("", "") == (-1, "could not run it: the exec ended without a status")
    assert exec_outcome("not json", "")[0] == -1
