"""What a process's open file descriptors are: the soak's breakdown of a descriptor count (benchmarks/soak.py).

A count alone cannot tell a descriptor that stays (a leak) from the sockets of the traffic in flight or a pool
that grew to its bound; each descriptor here gets a kind:
- a TCP socket by its peer: `listen`, `inbound` (a client of one of the process's own listening ports), or the
  name of the service it connects to (`postgres`, `redis`, `worker`, `api`, `s3`, from the cluster's URLs),
  else `tcp-other`; `unix` for a Unix socket;
- otherwise `pipe`, `anon` (eventpoll, eventfd, timerfd, ...), `file` (a path; the paths are kept for a diff),
  `other`.
Linux only (/proc); a process that is gone or not readable counts nothing.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil


@dataclass
class FdKinds:
    """One process tree's descriptors by kind, and the paths of its open files."""

    counts: Counter[str] = field(default_factory=Counter)
    files: Counter[str] = field(default_factory=Counter)

    def add(self, other: FdKinds) -> None:
        """Fold another process's descriptors into these."""
        self.counts.update(other.counts)
        self.files.update(other.files)

    def as_json(self) -> dict[str, dict[str, int]]:
        """The JSON shape kept in a soak's samples."""
        return {"counts": dict(sorted(self.counts.items())), "files": dict(sorted(self.files.items()))}


def peer_ports(urls: Iterable[tuple[str, str | None]]) -> dict[int, str]:
    """(service name, URL) -> {port: service name}; URLs without a port get their scheme's default."""
    ports: dict[int, str] = {}
    for name, url in urls:
        if not url:
            continue
        parts = urlsplit(url.replace("postgresql+psycopg", "postgresql"))
        port = parts.port or {"postgresql": 5432, "redis": 6379, "http": 80, "https": 443}.get(parts.scheme)
        if port is not None:
            ports[port] = name
    return ports


def process_fd_kinds(proc: psutil.Process, peers: dict[int, str]) -> FdKinds:
    """The descriptors of one process (not its children) by kind."""
    kinds = FdKinds()
    try:
        sockets = {conn.fd: conn for conn in proc.net_connections(kind="all")}
        fds = os.listdir(f"/proc/{proc.pid}/fd")
    except (psutil.Error, OSError):
        return kinds
    listening = {
        conn.laddr.port for conn in sockets.values() if conn.status == psutil.CONN_LISTEN and conn.laddr
    }
    for name in fds:
        try:
            target = os.readlink(f"/proc/{proc.pid}/fd/{name}")
        except OSError:
            continue  # closed between the listing and the read
        conn = sockets.get(int(name))
        if conn is not None:
            kinds.counts[socket_kind(conn, listening, peers)] += 1
        elif target.startswith("socket:"):
            kinds.counts["socket-other"] += 1  # no connection listed: opened or closed meanwhile, or netlink
        elif target.startswith("pipe:"):
            kinds.counts["pipe"] += 1
        elif target.startswith("anon_inode:"):
            kinds.counts["anon"] += 1
        elif target.startswith("/"):
            kinds.counts["file"] += 1
            kinds.files[target] += 1
        else:
            kinds.counts["other"] += 1
    return kinds


def socket_kind(conn: Any, listening: set[int], peers: dict[int, str]) -> str:
    """A socket's kind: listen, unix, inbound, its peer service's name, or tcp-other."""
    if conn.family == socket.AF_UNIX:
        return "unix"
    if conn.status == psutil.CONN_LISTEN:
        return "listen"
    if conn.laddr and conn.laddr.port in listening:
        return "inbound"
    if conn.raddr and conn.raddr.port in peers:
        return peers[conn.raddr.port]
    return "tcp-other"


def tree_fd_kinds(pid: int, peers: dict[int, str]) -> FdKinds:
    """The descriptors of a process and its children, by kind (empty when it is gone)."""
    kinds = FdKinds()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return kinds
    for proc in procs:
        kinds.add(process_fd_kinds(proc, peers))
    return kinds


def diff(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per kind (and per file path) the change from one FdKinds.as_json() to another; zeros left out."""
    out: dict[str, dict[str, int]] = {}
    for part in ("counts", "files"):
        keys = set(before.get(part, {})) | set(after.get(part, {}))
        changes = {k: after.get(part, {}).get(k, 0) - before.get(part, {}).get(k, 0) for k in sorted(keys)}
        out[part] = {k: v for k, v in changes.items() if v}
    return out
