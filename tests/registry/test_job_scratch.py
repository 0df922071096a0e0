"""Validation jobs' scratch directories: a directory left by a killed process is removed by the next sweep or
start; one a live job holds, a young one, and anything not a job directory are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.job_scratch import (
    JOB_DIR_PREFIX,
    MIN_ABANDONED_AGE_S,
    job_scratch_dir,
    remove_abandoned_job_dirs,
)


def later() -> float:
    """A time at which every directory the test made so far is old (taken when called: a time fixed when the
    module was imported is not later than directories made many minutes into a long run)."""
    return time.time() + 10 * MIN_ABANDONED_AGE_S


HOLDER = """
import sys, time
from pathlib import Path
from registry.job_scratch import job_scratch_dir
with job_scratch_dir(Path(sys.argv[1])) as path:
    (path / "adapter_model.safetensors").write_bytes(b"x" * 1024)
    print(path, flush=True)
    time.sleep(3600)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process in the middle of a job: it holds a scratch directory in tmp_path until it is killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert process.stdout is not None
    path = Path(process.stdout.readline().strip())
    try:
        yield process, path
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow  # starts and kills a job process
def test_directory_of_a_killed_job_is_removed_and_a_live_one_is_kept(
    tmp_path: Path, holder: tuple[subprocess.Popen[str], Path]
) -> None:
    process, dead = holder
    with job_scratch_dir(tmp_path) as live:
        os.kill(process.pid, signal.SIGKILL)  # kill -9: no cleanup runs
        process.wait()
        assert dead.is_dir() and dead.name.startswith(JOB_DIR_PREFIX)
        assert remove_abandoned_job_dirs(tmp_path, now=later()) == [dead]
        assert not dead.exists() and live.is_dir()
    assert not live.exists()  # the live job removed its own at its end


@pytest.mark.slow  # starts and kills a job process
def test_directory_of_a_job_running_in_another_process_is_kept(
    tmp_path: Path, holder: tuple[subprocess.Popen[str], Path]
) -> None:
    _, path = holder
    assert remove_abandoned_job_dirs(tmp_path, now=later()) == []
    assert (path / "adapter_model.safetensors").is_file()


def test_young_directories_and_other_entries_are_left_alone(tmp_path: Path) -> None:
    young = tmp_path / f"{JOB_DIR_PREFIX}young"  # as if between its creation and its lock
    young.mkdir()
    other = tmp_path / "someone-else"
    other.mkdir()
    file = tmp_path / f"{JOB_DIR_PREFIX}file"
    file.write_text("not a directory")
    assert remove_abandoned_job_dirs(tmp_path) == []
    assert remove_abandoned_job_dirs(tmp_path, now=later()) == [young]
    assert other.is_dir() and file.is_file()


def test_a_missing_root_is_nothing_to_remove(tmp_path: Path) -> None:
    assert remove_abandoned_job_dirs(tmp_path / "missing") == []
