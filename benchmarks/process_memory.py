"""Memory of a process tree, sampled while it runs: total RSS and PSS over a process and all its descendants
(from /proc; vLLM runs an engine-core and a worker process besides its front end).
"""

from __future__ import annotations

import os
import threading


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(pid: int) -> list[int]:
    kids = _children_map()
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, []))
    return out


def _mem_kb(pid: int) -> tuple[int, int]:
    """(Rss, Pss) in kB of one process; zeros when it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


class TreeMemorySampler(threading.Thread):
    """Samples the total RSS and PSS of a process and all its descendants (vLLM runs an engine-core and
    a worker process besides the front end). PSS splits shared pages, so its sum does not double count."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss_kb = self.peak_pss_kb = 0
        self.max_procs = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids = _tree(self.pid)
            rss = pss = 0
            for p in pids:
                r, s = _mem_kb(p)
                rss += r
                pss += s
            self.peak_rss_kb = max(self.peak_rss_kb, rss)
            self.peak_pss_kb = max(self.peak_pss_kb, pss)
            self.max_procs = max(self.max_procs, len(pids))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
