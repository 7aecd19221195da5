"""A real TCP proxy for fault injection: put it in front of a node (``--advertise`` its port)
and make it swallow the node's answers and cut the connection at a chosen moment — the way
a network fails after a request reached the server but before the response reached the client.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``; ``hold()`` swallows upstream->client bytes
    from then on; ``partition()`` swallows the bytes of both ways (a network partition: the
    connections stay open, nothing gets through); ``cut()`` closes every connection (and
    stops swallowing)."""

    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._server = socket.create_server(("127.0.0.1", port))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._holding = False
        self._dropping = False
        self._closed = False
        #: Connections accepted so far (a client channel's connection attempts, whether or
        #: not the upstream took them).
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        with self._lock:
            self._holding = True

    def partition(self) -> None:
        with self._lock:
            self._dropping = True

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
            self._holding = self._dropping = False
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    if self._dropping or (answers and self._holding):
                        continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
