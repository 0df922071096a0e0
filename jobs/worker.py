"""Celery worker entry point: `celery -A jobs.worker worker --pool=solo`.

Like the CLI, this module is an entry point: it builds Settings (LORAHOST_* environment) once, here.
Library code never imports it.
"""

from __future__ import annotations

from jobs.celery_app import make_celery
from settings import Settings

app = make_celery(Settings())
