"""The election's requests against an apiserver that does not answer: each ends within the
election's own timeout, and is not sent again behind its back."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from etoperator.leader import LeaderElection

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


class Silent:
    """A listener that takes connections and reads requests but never answers (an apiserver
    just restarted, too loaded to); it counts the connections it took."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.taken: list[socket.socket] = []
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.taken.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.taken:
            conn.close()


def test_a_look_at_the_lease_is_one_request_bounded_by_its_timeout(tmp_path: Path) -> None:
    """A look that the client library retried (three more times on a read timeout) took four
    times `request_timeout`: past the renew deadline, so a new leader whose first renewals met
    a slow apiserver stopped with only one try, where the election's own loop would have tried
    again each second with what it had seen. Each look is one request now."""
    server = Silent()
    try:
        (tmp_path / "kubeconfig").write_text(KUBECONFIG.format(port=server.port))
        election = LeaderElection.connect(str(tmp_path / "kubeconfig"), "ns", "me")
        election.request_timeout = 0.3
        election.look()  # a read timeout, caught and logged
        assert len(server.taken) == 1
        assert not election.leading.is_set()
    finally:
        server.close()
