"""Waiting in tests for something another thread or process does: poll a condition until it holds or a
deadline passes (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout_s: float = 60.0, interval_s: float = 0.05) -> bool:
    """True as soon as `predicate()` is truthy; after `timeout_s`, whether it holds at that last look."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
