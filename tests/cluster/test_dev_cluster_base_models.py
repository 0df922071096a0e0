"""A dev-cluster with two base models of different shapes (issue 24's "done when"): the second is added to the
catalog at start and its worker fetches it from the blob store by name; adapters uploaded against each base are
served by that base's worker, metered with it; an adapter uploaded against the wrong base is refused with the
list; a third model added while the cluster runs serves without restarting anything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lorahost.dev_cluster import DevCluster
from lorahost.dev_services import run_cli
from tests.cluster.cluster_client import (
    ADAPTER_FILES,
    cluster_config,
    new_tenant,
    running_cluster,
    usage_rows,
)
from tests.registry.db_fixtures import redis_url  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

WIDE = "wide"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    demo_dir: Path,
    wide_demo_dir: Path,
    redis_url: str,  # noqa: F811
) -> Iterator[DevCluster]:
    """One API replica, Celery, one worker of the configured tiny model and one of the catalog's tiny64."""
    config = cluster_config(
        tmp_path_factory.mktemp("bases"), demo_dir / "base", redis_url, num_api=1, num_workers=1,
        catalog_models={WIDE: wide_demo_dir / "base"}, num_catalog_workers=1,
    )  # fmt: skip
    with running_cluster(config) as running:
        yield running


def _upload(cluster: DevCluster, key: str, name: str, adapter_dir: Path, base_model: str) -> httpx.Response:
    files = [("files", (n, (adapter_dir / n).read_bytes())) for n in ADAPTER_FILES]
    return httpx.post(
        f"{cluster.api_url}/v1/adapters",
        headers={"Authorization": f"Bearer {key}"},
        data={"name": name, "base_model": base_model},
        files=files,
        timeout=60,
    )


def _wait_ready(cluster: DevCluster, key: str, name: str) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body = httpx.get(
            f"{cluster.api_url}/v1/adapters/{name}", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).json()
        if body.get("latest_ready_version"):
            return
        time.sleep(0.2)
    raise AssertionError(f"adapter {name} not ready: {body}")


def _complete(cluster: DevCluster, key: str, model: str) -> dict[str, Any]:
    response = httpx.post(
        f"{cluster.api_url}/v1/completions",
        json={"model": model, "prompt": "hello world", "max_tokens": 4, "ignore_eos": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_each_base_models_adapters_are_served_by_its_own_workers(
    cluster: DevCluster, adapter_dirs: dict[str, Path], wide_demo_dir: Path
) -> None:
    tenant_id, key = new_tenant(cluster)
    local_adapter, wide_adapter = (
        next(iter(adapter_dirs.values())),
        min((wide_demo_dir / "adapters").iterdir()),
    )
    wrong = _upload(cluster, key, "w", wide_adapter, base_model="lorahost-base")
    assert wrong.status_code == 422 and f"it fits ['{WIDE}']" in wrong.text
    for name, adapter_dir, base in (("l", local_adapter, "lorahost-base"), ("w", wide_adapter, WIDE)):
        assert _upload(cluster, key, name, adapter_dir, base).status_code in (201, 202)
        _wait_ready(cluster, key, name)
    for model in ("l", "w", WIDE, "lorahost-base"):
        assert _complete(cluster, key, model)["usage"]["completion_tokens"] == 4
    workers = {w.worker_id: w.base_model for w in cluster.workers}
    rows = usage_rows(cluster.database_url or "", tenant_id)
    served = {(r.model_name, r.base_model_name, workers[r.worker_id]) for r in rows}
    assert served == {
        ("l", "lorahost-base", "lorahost-base"),
        ("lorahost-base", "lorahost-base", "lorahost-base"),
        ("w", WIDE, WIDE),
        (WIDE, WIDE, WIDE),
    }


def test_a_model_added_while_running_serves_without_a_restart(
    cluster: DevCluster, wide_demo_dir: Path
) -> None:
    run_cli(["models", "add", "wide-two", "--from", str(wide_demo_dir / "base")], cluster.child_env())
    cluster.start_worker(base_model="wide-two")
    _, key = new_tenant(cluster)
    assert _complete(cluster, key, "wide-two")["model"] == "wide-two"
