"""Hand-made usage rows for the length predictor's tests (training job, accuracy report, API reload): adapters
with distinct output-length distributions, at a fixed moment far from now so that no other test's rows fall
in their window."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from registry import repository
from registry.models import AdapterVersion, new_id
from registry.usage_batches import open_usage

BASE_MODEL = "lorahost-base"
MAX_TOKENS = 512
T0 = datetime(2031, 3, 1, tzinfo=UTC)  # the hand-made rows start here, one per second
# adapter name -> median output tokens
MEDIANS = {"short": 20, "long": 300}


@dataclass(frozen=True)
class RowSpec:
    """One hand-made finished request."""

    version_id: str | None
    completion_tokens: int
    predicted: int | None = None
    status: str = "ok"
    prompt_tokens: int = 50
    max_tokens: int | None = MAX_TOKENS
    is_chat: bool = False


def make_versions(session: Session, names: list[str]) -> tuple[str, dict[str, AdapterVersion]]:
    """A tenant and one ready adapter version per name (committed on the test's connection)."""
    tenant_id = repository.create_tenant(session, f"pred-{new_id()[:8]}").id
    versions = {}
    for name in names:
        adapter = repository.get_or_create_adapter(session, tenant_id, name, base_model_name=BASE_MODEL)
        versions[name] = repository.add_adapter_version(
            session,
            tenant_id,
            adapter,
            status="ready",
            sha256="0" * 64,
            rank=4,
            config_blob_key=f"k/{name}/c",
            weights_blob_key=f"k/{name}/w",
        )
    session.commit()
    return tenant_id, versions


def insert_rows(session: Session, tenant_id: str, specs: list[RowSpec], start: datetime = T0) -> None:
    """The rows, one per second from `start`, in order."""
    adapter_ids = {
        v: session.get_one(AdapterVersion, v).adapter_id for v in {s.version_id for s in specs} if v
    }
    rows: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        rows.append(
            {
                "request_id": f"req-{new_id()}",
                "tenant_id": tenant_id,
                "adapter_version_id": spec.version_id,
                "adapter_id": adapter_ids.get(spec.version_id) if spec.version_id else None,
                "model_name": "m",
                "prompt_tokens": spec.prompt_tokens,
                "completion_tokens": spec.completion_tokens,
                "predicted_output_tokens": spec.predicted,
                "status": spec.status,
                "started_at": start + timedelta(seconds=i),
                "finished_at": start + timedelta(seconds=i + 1),
                "max_tokens": spec.max_tokens,
                "is_chat": spec.is_chat,
                "has_stop": False,
            }
        )
    open_usage(session, rows)


def distinct_specs(versions: dict[str, AdapterVersion], num_rows: int, seed: int = 0) -> list[RowSpec]:
    """`num_rows` finished requests spread over the versions, each version's lengths log-normal around its
    MEDIANS entry."""
    rng = np.random.default_rng(seed)
    names = sorted(versions)
    specs = []
    for _ in range(num_rows):
        name = names[int(rng.integers(len(names)))]
        true = int(min(MAX_TOKENS, max(1, round(MEDIANS[name] * rng.lognormal(0, 0.15)))))
        specs.append(RowSpec(versions[name].id, true, prompt_tokens=int(rng.integers(10, 200))))
    return specs
