"""The settings package: imports no numpy/scipy, the README table names every setting, interval 0 = disabled."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from api import main as api_main
from jobs.celery_app import beat_schedule
from jobs.task_names import (
    CLOSE_ORPHANED_USAGE_TASK,
    COMPUTE_PLACEMENT_TASK,
    FAIL_STALE_VERSIONS_TASK,
    SWEEP_ORPHANED_BLOBS_TASK,
    TRAIN_LENGTH_PREDICTOR_TASK,
)
from settings import Settings
from settings.env import flat_fields
from settings.section import env_name

REPO_ROOT = Path(__file__).resolve().parents[2]
# Each periodic job's interval -> (its Celery beat tasks, the API's inline timer starter).
PERIODIC_JOBS = {
    "usage_sweep_interval_s": ({CLOSE_ORPHANED_USAGE_TASK}, api_main._start_usage_sweep),
    "upload_sweep_interval_s": (
        {FAIL_STALE_VERSIONS_TASK, SWEEP_ORPHANED_BLOBS_TASK},
        api_main._start_upload_sweep,
    ),
    "predictor_training_interval_s": ({TRAIN_LENGTH_PREDICTOR_TASK}, api_main._start_predictor_training),
    "placement_interval_s": ({COMPUTE_PLACEMENT_TASK}, api_main._start_placement),
}


def test_importing_the_settings_loads_no_numpy_or_scipy() -> None:
    code = "import sys, settings; print(sorted({'numpy', 'scipy', 'torch'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def _readme_table_names() -> set[str]:
    rows = [
        line for line in (REPO_ROOT / "README.md").read_text().splitlines() if line.startswith("| `LORAHOST_")
    ]
    return {name for row in rows for name in re.findall(r"LORAHOST_[A-Z0-9_]*", row.split("|")[1])}


def test_the_readme_settings_table_names_every_setting_and_only_real_ones() -> None:
    names = {env_name(flat) for flat in flat_fields(Settings)}
    in_readme = _readme_table_names()
    assert names - in_readme == set(), "settings missing from the README table"
    assert in_readme - names == set(), "README rows naming no setting"


@pytest.mark.parametrize("interval", sorted(PERIODIC_JOBS))
def test_an_interval_of_0_disables_the_job_in_celery_beat_and_in_the_inline_timer(interval: str) -> None:
    tasks, start_inline_timer = PERIODIC_JOBS[interval]
    scheduled = {entry["task"] for entry in beat_schedule(Settings(**{interval: 30.0})).values()}
    assert tasks <= scheduled
    disabled = Settings(is_inline_jobs=True, **{interval: 0})
    assert not tasks & {entry["task"] for entry in beat_schedule(disabled).values()}
    assert start_inline_timer(SimpleNamespace(settings=disabled)) is None


def test_the_default_router_policy_is_the_schedulers_default() -> None:
    from scheduler.routing.router_policies import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES

    assert Settings().routing.policy == DEFAULT_ROUTER_POLICY
    assert DEFAULT_ROUTER_POLICY in ROUTER_POLICIES


def test_the_default_placement_policy_is_the_schedulers_default() -> None:
    from scheduler.placement.placement_baselines import DEFAULT_PLACEMENT_POLICY, PLACEMENT_POLICIES

    assert Settings().placement.policy == DEFAULT_PLACEMENT_POLICY
    assert DEFAULT_PLACEMENT_POLICY in PLACEMENT_POLICIES
