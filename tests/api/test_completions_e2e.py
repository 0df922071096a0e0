"""End to end over real HTTP: the API served by uvicorn, a real worker process with the tiny model, the
official `openai` client, adapters uploaded through the API into the blob store the worker reads.

One worker process and one API server per module (SQLite file database); each test uses its own tenants.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from api.main import create_app
from api.services import Services, build_services
from cluster.membership import WorkerRecord
from cluster.protocol import INTERNAL_PREFIX, WorkerStats
from registry.models import UsageRecord
from settings import Settings
from tests.polling import wait_for
from tests.worker_harness import RunningWorker, free_port, serving, worker_process

ADMIN_KEY = "e2e-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
pytestmark = pytest.mark.slow


@dataclass
class PolledDirectory:
    """A worker directory that asks the worker for its live stats (no Redis shared with other test runs)."""

    url: str
    token: str
    extra_records: list[WorkerRecord] = field(default_factory=list)

    def list_live(self) -> list[WorkerRecord]:
        stats = httpx.get(
            f"{self.url}{INTERNAL_PREFIX}/stats", headers={"Authorization": f"Bearer {self.token}"}, timeout=5
        ).json()
        record = WorkerRecord.from_stats(WorkerStats.model_validate(stats), self.url)  # the worker's own view
        return sorted([record, *self.extra_records], key=lambda r: r.worker_id)


@dataclass
class Stack:
    """The running API + worker."""

    url: str
    services: Services
    worker: RunningWorker
    directory: PolledDirectory

    def tenant(self, name: str) -> str:
        """A new tenant's API key."""
        with httpx.Client(base_url=self.url, headers=ADMIN, timeout=30) as c:
            tenant = c.post("/v1/admin/tenants", json={"name": name}).json()
            return c.post(f"/v1/admin/tenants/{tenant['id']}/keys").json()["key"]

    def upload(self, key: str, name: str, adapter_dir: Path, visibility: str = "private") -> dict:
        files = [
            ("files", (f, (adapter_dir / f).read_bytes(), "application/octet-stream")) for f in ADAPTER_FILES
        ]
        response = httpx.post(
            f"{self.url}/v1/adapters",
            data={"name": name, "visibility": visibility},
            files=files,
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert response.status_code == 202, response.text
        assert response.json()["version"]["status"] == "ready", response.text
        return response.json()

    def openai(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(api_key=key, base_url=f"{self.url}/v1", max_retries=0, timeout=60)

    def tenant_id_of(self, key: str) -> str:
        from registry import api_keys

        with self.services.session_factory() as session:
            row = api_keys.find_api_key(session, key)
            assert row is not None
            return row.tenant_id


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path) -> Iterator[Stack]:
    from migrations.runner import upgrade

    root = tmp_path_factory.mktemp("e2e")
    blob_dir = root / "blobs"
    database_url = f"sqlite:///{root / 'api.db'}"
    upgrade(database_url)
    with worker_process(base_model_dir, blob_dir) as worker:
        settings = Settings(
            data_dir=root,
            database_url=database_url,
            blob_store=str(blob_dir),
            admin_key=ADMIN_KEY,
            base_model_path=base_model_dir,
            redis_url=None,
            is_inline_jobs=True,
            cold_start_timeout_s=1.0,  # the dead-worker test waits this long for a worker, then gets its 503
        )
        services = build_services(settings)
        directory = PolledDirectory(worker.url, worker.internal_token)
        services.worker_directory = directory
        services.internal_token = worker.internal_token
        try:
            with serving(create_app(settings, services=services)) as url:
                yield Stack(url, services, worker, directory)
        finally:
            services.close()


def rows_of(stack: Stack, key: str) -> list[UsageRecord]:
    tenant_id = stack.tenant_id_of(key)
    with stack.services.session_factory() as session:
        query = select(UsageRecord).where(UsageRecord.tenant_id == tenant_id).order_by(UsageRecord.started_at)
        return list(session.scalars(query))


def test_openai_client_completions_and_chat_plain_and_streaming(
    stack: Stack, adapter_dirs: dict[str, Path]
) -> None:
    key = stack.tenant("e2e-openai")
    stack.upload(key, "writer", adapter_dirs["adapter-00"])
    client = stack.openai(key)
    for model in ("lorahost-base", "writer"):
        plain = client.completions.create(model=model, prompt="hello world", max_tokens=6, temperature=0)
        assert plain.usage.completion_tokens == 6 and plain.choices[0].finish_reason == "length"
        streamed = client.completions.create(
            model=model, prompt="hello world", max_tokens=6, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text
    chat = client.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert chat.usage.completion_tokens == 5 and chat.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="writer",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == chat.choices[0].message.content
    )
    assert (
        chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == chat.usage.prompt_tokens
    )
    rows = rows_of(stack, key)
    assert len(rows) == 6 and {r.status for r in rows} == {"ok"}
    assert all(r.completion_tokens in (5, 6) and r.worker_id == stack.worker.worker_id for r in rows)


def test_version_pinning_changes_outputs_and_is_metered_per_version(
    stack: Stack, adapter_dirs: dict[str, Path]
) -> None:
    key = stack.tenant("e2e-pinning")
    v1 = stack.upload(key, "pinned", adapter_dirs["adapter-01"])["version"]
    v2 = stack.upload(key, "pinned", adapter_dirs["adapter-02"])["version"]
    client = stack.openai(key)

    def greedy(model: str) -> str:
        return (
            client.completions.create(model=model, prompt="the model serve", max_tokens=12, temperature=0)
            .choices[0]
            .text
        )

    first, second, latest = greedy("pinned@1"), greedy("pinned@2"), greedy("pinned")
    assert first != second and latest == second and greedy("pinned@1") == first
    assert [r.adapter_version_id for r in rows_of(stack, key)] == [v1["id"], v2["id"], v2["id"], v1["id"]]


def test_a_deleted_then_reuploaded_adapter_is_never_served_from_a_stale_cache(
    stack: Stack, adapter_dirs: dict[str, Path]
) -> None:
    """Every cache the first upload warmed (the API's model cache, the worker's host files, the engine's
    device copy and its prefix KV blocks) must give way to the tenant's delete and new upload."""
    key = stack.tenant("e2e-stale")
    client = stack.openai(key)

    def greedy(model: str) -> str:
        completion = client.completions.create(
            model=model, prompt="the model serve", max_tokens=12, temperature=0
        )
        return completion.choices[0].text

    stack.upload(key, "reused", adapter_dirs["adapter-01"])
    old = greedy("reused")
    assert greedy("reused") == old  # served warm: device copy and cached prefix blocks
    deleted = httpx.delete(
        f"{stack.url}/v1/adapters/reused", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert deleted.status_code == 200, deleted.text
    with pytest.raises(openai.NotFoundError):
        greedy("reused")
    stack.upload(key, "reused", adapter_dirs["adapter-02"])
    stack.upload(key, "reference", adapter_dirs["adapter-02"])
    new = greedy("reused")
    assert new == greedy("reference") and new != old


def test_same_weights_with_another_lora_alpha_is_served_with_its_own_config(
    stack: Stack, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 13: tenant C's adapter (tenant B's weights, another lora_alpha) was served with B's alpha."""
    outputs = {}
    for tenant, alpha in (("e2e-alpha-b", 8), ("e2e-alpha-c", 32)):
        adapter_dir = tmp_path / tenant
        shutil.copytree(adapter_dirs["adapter-01"], adapter_dir)
        config = json.loads((adapter_dir / "adapter_config.json").read_text())
        (adapter_dir / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": alpha}))
        key = stack.tenant(tenant)
        stack.upload(key, "same-weights", adapter_dir)
        completion = stack.openai(key).completions.create(
            model="same-weights", prompt="the model serve", max_tokens=12, temperature=0
        )
        outputs[alpha] = completion.choices[0].text
    assert outputs[8] != outputs[32]


def test_tenant_isolation_on_inference(stack: Stack, adapter_dirs: dict[str, Path]) -> None:
    owner, other = stack.tenant("e2e-owner"), stack.tenant("e2e-other")
    stack.upload(owner, "private-one", adapter_dirs["adapter-03"])
    stack.upload(owner, "public-one", adapter_dirs["adapter-04"], visibility="public")
    client = stack.openai(other)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="private-one", prompt="hello", max_tokens=2)
    assert (
        client.completions.create(model="public-one", prompt="hello", max_tokens=2).usage.completion_tokens
        == 2
    )
    assert [r.status for r in rows_of(stack, other)] == ["rejected", "ok"]
    assert rows_of(stack, owner) == []


def test_client_disconnect_mid_stream_aborts_and_meters_delivered_tokens_once(stack: Stack) -> None:
    key = stack.tenant("e2e-disconnect")
    body = {
        "model": "lorahost-base",
        "prompt": "hello world",
        "max_tokens": 900,
        "temperature": 1.0,
        "seed": 3,
        "stream": True,
    }
    num_read = 0
    with (
        httpx.Client(timeout=60) as http,
        http.stream(
            "POST", f"{stack.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                num_read += 1
            if num_read == 3:
                break
    row = _wait_for_row(stack, key)
    assert row.status == "aborted", row.error_message
    assert 3 <= row.completion_tokens < 900 and row.prompt_tokens > 0
    assert wait_for(lambda: stack.directory.list_live()[0].scheduler.num_running == 0), (
        "the engine request was not aborted"
    )
    assert len(rows_of(stack, key)) == 1


def test_every_authenticated_request_is_metered_exactly_once(stack: Stack) -> None:
    key = stack.tenant("e2e-exactly-once")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as http:
        statuses = [
            http.post(
                "/v1/completions", json={"model": "lorahost-base", "prompt": "a b", "max_tokens": 3}
            ).status_code,
            http.post("/v1/completions", json={"model": "lorahost-base", "prompt": "a", "n": 0}).status_code,
            http.post("/v1/completions", json={"model": "missing", "prompt": "a"}).status_code,
            http.post(
                "/v1/chat/completions",
                json={
                    "model": "lorahost-base",
                    "stream": True,
                    "max_tokens": 3,
                    "messages": [{"role": "user", "content": "x"}],
                },
            ).status_code,
        ]
    assert statuses == [200, 400, 404, 200]
    rows = rows_of(stack, key)
    assert [r.status for r in rows] == ["ok", "rejected", "rejected", "ok"]
    assert [r.completion_tokens for r in rows] == [3, 0, 0, 3]
    assert len({r.request_id for r in rows}) == 4


def _let_the_worker_view_refresh(stack: Stack) -> None:
    """The API reads the directory through a listing cached for worker_view_cache_s: wait it out."""
    time.sleep(stack.services.worker_listing.ttl_s)


def test_dead_worker_is_retried_then_503_when_none_is_left(stack: Stack) -> None:
    key = stack.tenant("e2e-dead-worker")
    dead = WorkerRecord("0-dead", f"http://127.0.0.1:{free_port()}", "lorahost-base", max_num_seqs=16)
    stack.directory.extra_records.append(dead)  # sorts first and is idle: chosen first
    _let_the_worker_view_refresh(stack)
    try:
        response = httpx.post(
            f"{stack.url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "lorahost-base", "prompt": "hi", "max_tokens": 2},
            timeout=60,
        )
        assert response.status_code == 200  # retried on the real worker
        stack.directory.list_live = lambda: [dead]  # type: ignore[method-assign]
        _let_the_worker_view_refresh(stack)
        response = httpx.post(
            f"{stack.url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "lorahost-base", "prompt": "hi", "max_tokens": 2},
            timeout=60,
        )
        assert response.status_code == 503 and int(response.headers["retry-after"]) > 0
        assert "unreachable" in response.json()["error"]["message"]
    finally:
        del stack.directory.list_live
        stack.directory.extra_records.clear()
        _let_the_worker_view_refresh(stack)
    assert [(r.status, r.worker_id) for r in rows_of(stack, key)] == [
        ("ok", stack.worker.worker_id),
        ("rejected", None),
    ]


def test_metrics_expose_requests_and_worker_gauges(stack: Stack) -> None:
    key = stack.tenant("e2e-metrics")
    stack.openai(key).completions.create(model="lorahost-base", prompt="hi", max_tokens=2)
    text = httpx.get(f"{stack.url}/metrics", headers=ADMIN).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("lorahost_requests_total", (("status", "ok"),))] >= 1
    assert samples[("lorahost_tokens_total", (("kind", "completion"),))] >= 2
    assert ("lorahost_worker_queue_depth", (("worker", stack.worker.worker_id),)) in samples


def _wait_for_row(stack: Stack, key: str) -> UsageRecord:
    """The request's usage row once it is closed (it is written in_progress when the request starts)."""
    is_closed = lambda: [r.status for r in rows_of(stack, key)] not in ([], ["in_progress"])
    assert wait_for(is_closed), "no usage row was closed"
    return rows_of(stack, key)[0]
