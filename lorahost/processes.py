"""Child processes of `lorahost dev-cluster`: spawn with a log file, signal their process group, stop cleanly.

Each child runs in its own session (process group), so a terminal's Ctrl-C reaches only the parent, which
stops the children in order, and a signal sent to a child reaches its own children too (Celery's embedded
beat, a compiler the worker started). `stop_all` sends SIGTERM to every child first (workers drain,
uvicorn finishes its requests), waits for all within one deadline, then SIGKILLs the process groups left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

DEFAULT_STOP_TIMEOUT_S = 30.0
MAX_LOG_TAIL_CHARS = 4000


class ChildFailedError(RuntimeError):
    """A child process exited, or never became healthy, while it was being started."""


@dataclass
class ChildProcess:
    """One spawned child: its name (api-0, worker id, jobs, s3), the process, its log file and URL."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    url: str | None = None

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        return self.popen.pid

    @property
    def is_running(self) -> bool:
        """True until the child has exited (and been reaped)."""
        return self.popen.poll() is None

    def send_signal(self, sig: int) -> None:
        """Signal the child's process group (no-op once it has exited)."""
        if not self.is_running:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running after timeout_s."""
        try:
            return self.popen.wait(max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> int:
        """SIGTERM (graceful: drain), wait up to timeout_s, then SIGKILL the group; returns the exit code."""
        return stop_all([self], timeout_s)[self.name]

    def log_tail(self, max_chars: int = MAX_LOG_TAIL_CHARS) -> str:
        """The end of the child's log (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""


def spawn(
    name: str,
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    url: str | None = None,
) -> ChildProcess:
    """Start `command` in a new session with stdout+stderr appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ChildProcess(name=name, popen=popen, log_path=log_path, url=url)


def stop_all(children: Iterable[ChildProcess], timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> dict[str, int]:
    """SIGTERM every child, wait for all within timeout_s, SIGKILL the rest; name -> exit code."""
    children = list(children)
    for child in children:
        child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    codes: dict[str, int] = {}
    for child in children:
        code = child.wait(deadline - time.monotonic())
        if code is None:
            child.send_signal(signal.SIGKILL)
            code = child.popen.wait()
        else:
            _kill_leftover_group(child)
        codes[child.name] = code
    return codes


def _kill_leftover_group(child: ChildProcess) -> None:
    """After the leader exited: SIGKILL whatever of its group is left (e.g. a grandchild), so none outlives it."""
    try:
        os.killpg(child.popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on host."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(
    child: ChildProcess, is_ready: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2
) -> None:
    """Poll is_ready until True; ChildFailedError (with the log tail) if the child exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.is_running:
            raise ChildFailedError(
                f"{child.name} exited with {child.popen.returncode} before {what}; log {child.log_path}:\n"
                f"{child.log_tail()}"
            )
        if is_ready():
            return
        time.sleep(poll_s)
    raise ChildFailedError(
        f"{child.name} not {what} after {timeout_s:g} s; log {child.log_path}:\n{child.log_tail()}"
    )


def http_ok(url: str, headers: Mapping[str, str] | None = None) -> bool:
    """True when GET url answers 200."""
    try:
        return httpx.get(url, headers=dict(headers or {}), timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def child_state(child: ChildProcess, is_ok: bool) -> str:
    """A child's health as printed: exited(<code>), ok or down (`is_ok`: its health check passed)."""
    if not child.is_running:
        return f"exited({child.popen.returncode})"
    return "ok" if is_ok else "down"


def log_contains(child: ChildProcess, text: str) -> bool:
    """True once the child's log contains text."""
    return text in child.log_tail(max_chars=1 << 20)
