"""A dev-cluster with one vLLM worker and one native worker (`worker_engines`) serves a tenant's uploaded
adapters through the same API, metered once per request with the worker that served it, and both engines
answer a greedy request with the same text (issue 23's "done when").

Needs vllm in the Python running pytest (the cluster's workers run with it): the vLLM step of CI
(scripts/test_vllm.sh) runs it; elsewhere it is skipped unless LORAHOST_REQUIRE_VLLM=1."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.protocol import WorkerStats
from lorahost.dev_cluster import DevCluster
from tests.cluster.cluster_client import (
    BASE_MODEL,
    cluster_config,
    new_tenant,
    running_cluster,
    upload_ready,
    usage_rows,
)
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None and os.environ.get("LORAHOST_REQUIRE_VLLM") != "1",
        reason="vllm is not installed here (CI runs this in its vLLM venv: scripts/test_vllm.sh)",
    ),
]

NUM_TOKENS = 6
PROMPT = "hello world the river"


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny64 demo model (base/) and two adapters (adapters/<name>/)."""
    from gpu_workers.engine.demo_model import generate_demo

    model = tmp_path_factory.mktemp("tiny64")
    generate_demo(model, size="tiny64", num_adapters=2, seed=0)
    return model


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    tiny64: Path,
    redis_url: str,  # noqa: F811
) -> Iterator[DevCluster]:
    """One API replica, Celery for uploads, worker 0 on vLLM and worker 1 native, on the tiny64 model."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("LORAHOST_REQUIRE_VLLM=1 but vllm is not installed in this Python")
    config = cluster_config(
        tmp_path_factory.mktemp("engines"), tiny64 / "base", redis_url, num_api=1, num_workers=2,
        worker_engines=("vllm", "native"),
    )  # fmt: skip
    with running_cluster(config) as running:
        yield running


def _complete(cluster: DevCluster, key: str, model: str) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": NUM_TOKENS, "temperature": 0, "ignore_eos": True}
    response = httpx.post(
        f"{cluster.api_url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _worker_stats(cluster: DevCluster, index: int) -> WorkerStats:
    worker = cluster.workers[index]
    response = httpx.get(
        f"{worker.url}/internal/v1/stats",
        headers={"Authorization": f"Bearer {cluster.internal_token}"},
        timeout=30,
    )
    return WorkerStats.model_validate_json(response.content)


def test_one_native_and_one_vllm_worker_serve_the_same_adapters_metered_once(
    cluster: DevCluster, tiny64: Path
) -> None:
    assert [w.engine for w in cluster.workers] == ["vllm", "native"]
    assert [_worker_stats(cluster, i).engine.backend for i in (0, 1)] == ["vllm", "native"]
    tenant_id, key = new_tenant(cluster)
    adapters = tiny64 / "adapters"
    for name in ("adapter-00", "adapter-01"):
        upload_ready(cluster, key, name, adapters / name)
    models = ["adapter-00", "adapter-01", BASE_MODEL]

    vllm_worker, native_worker = (w.worker_id for w in cluster.workers)
    mixed = {m: _complete(cluster, key, m) for m in models}  # both live: the router picks
    cluster.stop_worker(native_worker)  # drain the native worker: vLLM serves alone
    cluster.wait_live_workers(lambda ids: ids == [vllm_worker])
    on_vllm = {m: _complete(cluster, key, m) for m in models}
    native_worker = cluster.start_worker(engine="native").worker_id
    cluster.stop_worker(vllm_worker)  # and now the native engine alone
    cluster.wait_live_workers(lambda ids: ids == [native_worker])
    on_native = {m: _complete(cluster, key, m) for m in models}

    for model in models:
        vllm_text, native_text = (r["choices"][0]["text"] for r in (on_vllm[model], on_native[model]))
        assert vllm_text == native_text, model  # fp32 greedy: the same tokens from both engines
        assert on_vllm[model]["usage"]["completion_tokens"] == NUM_TOKENS
    assert on_vllm["adapter-00"]["choices"][0]["text"] != on_vllm[BASE_MODEL]["choices"][0]["text"]

    assert cluster.database_url is not None
    rows = usage_rows(cluster.database_url, tenant_id)
    assert len(rows) == 3 * len(models)  # one row per request
    assert all(r.status == "ok" and r.completion_tokens == NUM_TOKENS for r in rows)
    by_id = {r.request_id: r.worker_id for r in rows}
    for answers, worker_id in ((on_vllm, vllm_worker), (on_native, native_worker)):
        assert {by_id["req-" + a["id"].split("-", 1)[1]] for a in answers.values()} == {worker_id}
    assert all(mixed[m]["choices"][0]["text"] == on_native[m]["choices"][0]["text"] for m in models)
