"""A TCP proxy in front of a real server that can lose an answer or refuse a request, for the
client's retry tests: what a flaky network or a restarting gateway does, with the real service
behind it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque
from typing import Literal

Fault = Literal["drop_response", "unavailable"]

_BODY = b'{"detail": "the database is unavailable", "code": "unavailable"}'
UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 0\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY)
)


def read_request(conn: socket.socket) -> bytes:
    """One whole HTTP request (head, then a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class FaultyProxy:
    """Relays connections to ``upstream``. Each new connection takes the next planned fault:
    ``drop_response`` forwards the request, waits for the server's answer to begin (the server has
    done the work) and closes the connection without passing it on; ``unavailable`` answers 503
    itself without forwarding. With no fault planned, bytes are relayed both ways."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: deque[Fault] = deque()
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            fault = self.faults.popleft() if self.faults else None
            threading.Thread(target=self._serve, args=(conn, fault), daemon=True).start()

    def _serve(self, conn: socket.socket, fault: Fault | None) -> None:
        with conn:
            if fault == "unavailable":
                self.requests.append(read_request(conn))
                conn.sendall(UNAVAILABLE)
                return
            with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                if fault == "drop_response":
                    request = read_request(conn)
                    self.requests.append(request)
                    upstream.sendall(request)
                    upstream.recv(1)  # the answer begins: the request was handled
                    return
                pump = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
                pump.start()
                _pipe(conn, upstream)
                pump.join()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)
