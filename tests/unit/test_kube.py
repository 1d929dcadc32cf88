"""How an exec's end, as the kubelet tells it, becomes an exit code and a reason; how a
stopped replica's writes are shut."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from kubernetes import client as k8s

from etoperator.kube import Kube, Stopped, exec_outcome


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


class Server(http.server.ThreadingHTTPServer):
    """An HTTP server answering every request with `{}`, a PATCH only once `release` is set;
    it keeps the requests it received."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.release, self.patching = threading.Event(), threading.Event()
        self.seen: list[str] = []


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.command)
        if self.command == "PATCH":
            self.server.patching.set()
            self.server.release.wait(10)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = answer

    def log_message(self, *_: object) -> None:
        pass


def test_a_stopped_replica_waits_for_its_sent_write_and_sends_no_new_one() -> None:
    """The hand-over of a graceful stop: the write already sent ends, no new write leaves,
    reads still work (a pass in flight no longer holds the Lease back)."""
    server = Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    kube = Kube(k8s.ApiClient(cfg))
    sent = threading.Thread(target=lambda: kube.patch("Pod", "ns", "p", {"metadata": {}}))
    sent.start()
    try:
        assert server.patching.wait(10)
        assert kube.gate.close(timeout=0.2) is False  # the PATCH is still out
        server.release.set()
        assert kube.gate.close(timeout=10) is True
        with pytest.raises(Stopped):
            kube.create({"kind": "Pod", "apiVersion": "v1", "metadata": {"namespace": "ns"}})
        assert kube.get("Pod", "ns", "p") == {}
        assert server.seen == ["PATCH", "GET"]
    finally:
        server.release.set()
        sent.join(10)
        server.shutdown()
