"""A TCP relay to the apiserver that a test can cut (open connections closed, new ones refused)
and restore: an apiserver outage as a client in a pod sees it, TLS passing through untouched.
Or silence: connections stay open and nothing passes (a peer deleted under them, whose
address no longer answers)."""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, port)
        self.port = 0
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.silent = threading.Event()  # set: nothing passes, no connection is refused
        self.held = threading.Event()  # something was sent while silent

    def restore(self) -> Relay:
        """Listen (again, on the same port once it has one)."""
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self.port = server.getsockname()[1]
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def cut(self) -> None:
        with self._lock:
            server, self._server = self._server, None
            conns, self._open = self._open, set()
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            server.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            with self._lock:
                if self._server is not server:
                    client.close()
                    upstream.close()
                    return
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.silent.is_set():
                    self.held.set()  # a call waits for an answer that never comes
                else:
                    dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
