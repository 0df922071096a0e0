"""Scratch directories of validation jobs (`lorahost-job-*` in the temp dir), and their removal after a crash.

A job's directory is removed when the job ends. A process killed mid-job (kill -9, OOM) cannot remove it, so
each job holds an exclusive flock on its directory for as long as it runs: the kernel drops the lock when
the process dies, however it dies. `remove_abandoned_job_dirs` removes the directories whose lock nobody
holds, whichever process left them; a directory a live job holds is never touched. It runs when a process
that runs jobs starts (the Celery worker's first task, `lorahost serve`) and with every upload sweep
(registry/upload_sweeper.py).

A directory exists for a moment between its creation and its lock: one younger than MIN_ABANDONED_AGE_S is
left alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

JOB_DIR_PREFIX = "lorahost-job-"
MIN_ABANDONED_AGE_S = 60.0


def job_scratch_root() -> Path:
    """Where job directories are made: the process's temp dir (TMPDIR)."""
    return Path(tempfile.gettempdir())


@contextmanager
def job_scratch_dir(root: Path | None = None) -> Iterator[Path]:
    """A new `lorahost-job-*` directory, locked for the life of the block and removed at its end."""
    path = Path(tempfile.mkdtemp(prefix=JOB_DIR_PREFIX, dir=root or job_scratch_root()))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)  # releases the lock once the directory is gone


def remove_abandoned_job_dirs(
    root: Path | None = None, now: float | None = None, min_age_s: float = MIN_ABANDONED_AGE_S
) -> list[Path]:
    """Remove the job directories in `root` that no live process holds (and older than `min_age_s` at `now`,
    epoch seconds); returns them."""
    now = time.time() if now is None else now
    removed = [
        path for path in _job_dirs(root or job_scratch_root()) if _remove_if_abandoned(path, now, min_age_s)
    ]
    if removed:
        log.warning("removed %d job scratch dir(s) left by killed processes: %s", len(removed), removed)
    return removed


def _job_dirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.name.startswith(JOB_DIR_PREFIX))
    except FileNotFoundError:
        return []


def _remove_if_abandoned(path: Path, now: float, min_age_s: float) -> bool:
    """Take the directory's lock without waiting; if it is free the owner is dead: remove it, holding the lock."""
    try:
        if path.is_symlink() or not path.is_dir() or now - path.stat().st_mtime < min_age_s:
            return False
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # its job just ended
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # a live job holds it
        os.close(fd)
        return False
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)
    return True
