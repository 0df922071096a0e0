"""Running a benchmark's child process: its environment, a wait with a timeout, and the machine's other load
(busy cores before it starts; cores busy with anything but the child while it runs), since the machine may
be shared and numbers taken under foreign load are not comparable.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def child_env() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH and tokenizers single-process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float = 2.0) -> float:
    """Average number of busy cores over `seconds` (call while this benchmark is idle: = other load)."""
    b0, t0 = cpu_busy_s(), time.monotonic()
    time.sleep(seconds)
    return (cpu_busy_s() - b0) / (time.monotonic() - t0)


def wait_until_idle(max_busy_cores: float = 0.3, timeout_s: float = 90.0, seconds: float = 2.0) -> float:
    """Busy cores once they are at most `max_busy_cores` (e.g. the previous system's processes have exited),
    or the last reading after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    busy = busy_cores(seconds)
    while busy > max_busy_cores and time.monotonic() < deadline:
        busy = busy_cores(seconds)
    return busy


def wait_with_timeout(proc: subprocess.Popen, timeout_s: float) -> tuple[int, Any, bool]:
    """Wait for a child (killed after timeout_s): (wait status, its rusage, whether it timed out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, ru, False
        if time.monotonic() > deadline:
            proc.kill()
            _, status, ru = os.wait4(proc.pid, 0)
            return status, ru, True
        time.sleep(0.2)


class ChildClock:
    """Wall time and the machine's busy CPU time from just before a child starts."""

    def __init__(self) -> None:
        self.cpu0 = cpu_busy_s()
        self.t0 = time.perf_counter()

    def stop(self, rusage: Any) -> tuple[float, float]:
        """(wall seconds, average cores busy with anything but the child whose rusage is given): all busy CPU
        time since the start minus the child tree's own."""
        wall = time.perf_counter() - self.t0
        foreign = (cpu_busy_s() - self.cpu0 - (rusage.ru_utime + rusage.ru_stime)) / max(wall, 1e-9)
        return wall, foreign
