"""The Celery task names: the contract between whoever sends a task and the worker that runs it.

A leaf module (imports nothing), so the API can name a task without importing its body
(jobs/celery_app.py registers the bodies under these names; jobs/dispatch.py sends them).
"""

from __future__ import annotations

VALIDATE_ADAPTER_TASK = "lorahost.validate_adapter_version"
FAIL_STALE_VERSIONS_TASK = "lorahost.fail_stale_versions"
SWEEP_ORPHANED_BLOBS_TASK = "lorahost.sweep_orphaned_blobs"
CLOSE_ORPHANED_USAGE_TASK = "lorahost.close_orphaned_usage"
TRAIN_LENGTH_PREDICTOR_TASK = "lorahost.train_length_predictor"
COMPUTE_PLACEMENT_TASK = "lorahost.compute_placement"
RUN_CAPACITY_PLAN_TASK = "lorahost.run_capacity_plan"
