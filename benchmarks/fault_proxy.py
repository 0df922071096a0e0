"""A TCP fault proxy for chaos runs (benchmarks/chaos.py) and tests: put it between a client and a server
(PostgreSQL, a worker) and make the link fail on demand.

- `cut()`: every open connection is reset and new ones are refused (accepted, then closed at once), as a
  server that is restarting or failing over looks to its clients; `restore()` lets them through again.
- `delay_s`: each chunk forwarded either way waits this long first (a slow link).
- `is_stalled`: while True nothing is forwarded and nothing is closed (a link that went silent: a partition, a
  host that vanished without a reset); what arrived meanwhile is forwarded once it is False again.

Threads, one listener and two pumps per connection; `close()` stops them all and says how many connections it
carried (`num_connections`) and how many are still open (`num_open()`: a leak check).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

CHUNK_BYTES = 65536


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed peer does. The read side is shut first: that sends nothing
    but wakes a pump blocked in recv() on it, which would otherwise keep the connection open (a close() from
    another thread does not end a blocked recv(), so no RST would be sent and the peer would wait forever)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """Forwards 127.0.0.1:`port` to (target_host, target_port) until told to fail."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.delay_s = 0.0
        self.is_stalled = False
        self.num_connections = 0
        self._is_cut = False
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._is_closed = False
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until restore()."""
        with self._lock:
            self._is_cut = True
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _reset(sock)

    def restore(self) -> None:
        """Let connections through again."""
        with self._lock:
            self._is_cut = False

    def num_open(self) -> int:
        """Connections (client side and server side) the proxy holds open."""
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        """Stop listening and reset every connection."""
        self._is_closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._is_closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                is_cut = self._is_cut
            if is_cut:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open |= {client, server}
                self.num_connections += 1
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(CHUNK_BYTES)
                if not data:
                    break
                if self.delay_s:
                    time.sleep(self.delay_s)
                while self.is_stalled and not self._is_closed:
                    time.sleep(0.01)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {source, sink}
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
