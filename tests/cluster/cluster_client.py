"""Client side of the dev-cluster fault tests: a DevCluster for tests, tenants and adapters over REST, and
requests that record exactly what the client received (tokens, ids, how each one ended)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from lorahost.demo import setup_tenant
from lorahost.dev_cluster import DevCluster
from lorahost.dev_cluster_config import DevClusterConfig
from registry.db import make_engine, make_session_factory
from registry.models import UsageRecord
from tests.registry.db_fixtures import postgres_reachable, require_service
from tests.worker_harness import TEST_ENGINE_SETTINGS

BASE_MODEL = "lorahost-base"
REQUEST_TIMEOUT_S = 90.0  # per request: a hung request shows up as a client timeout, never as a stuck test
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# small engines (fast start, little memory), fast heartbeats, frequent usage checkpoints
CLUSTER_ENV = {f"LORAHOST_{k.upper()}": str(v) for k, v in TEST_ENGINE_SETTINGS.items()} | {
    "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S": "0.5",
    "LORAHOST_DRAIN_TIMEOUT_S": "10",
}


def cluster_config(
    data_dir: Path, base_model_dir: Path, redis_url: str, **overrides: Any
) -> DevClusterConfig:
    """A test DevCluster: free ports, the tiny model, the test run's S3 endpoint when there is one."""
    reason = postgres_reachable()
    if reason:
        require_service(reason)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(
            name, value
        )  # moto (the test run's, or the cluster's own) takes any credentials
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "base_model": base_model_dir,
        "redis_url": redis_url,
        "s3_endpoint": os.environ.get("LORAHOST_TEST_S3_ENDPOINT"),
        "start_timeout_s": 180.0,
        "stop_timeout_s": 20.0,
        "env": CLUSTER_ENV,
    }
    return DevClusterConfig(**(values | overrides))


@contextmanager
def running_cluster(config: DevClusterConfig) -> Iterator[DevCluster]:
    """A started DevCluster, stopped afterwards; on a failure the ends of its logs go to stderr."""
    cluster = DevCluster(config)
    cluster.start()
    try:
        yield cluster
    except BaseException:
        dump_logs(cluster)
        raise
    finally:
        cluster.stop()


def dump_logs(cluster: DevCluster, max_chars: int = 3000) -> None:
    """The end of every child's log, to stderr (pytest shows it with the failure)."""
    for path in sorted((cluster.data_dir / "logs").glob("*.log")):
        sys.stderr.write(f"\n==== {path.name} ====\n{path.read_text(errors='replace')[-max_chars:]}\n")


def new_tenant(cluster: DevCluster) -> tuple[str, str]:
    """(tenant id, key) created through the admin API."""
    return setup_tenant(cluster.next_api_url(), cluster.admin_key)


def upload_ready(
    cluster: DevCluster, key: str, name: str, adapter_dir: Path, timeout_s: float = 60.0
) -> None:
    """Upload a PEFT adapter over REST and wait until the Celery worker validated it (ready)."""
    headers = {"Authorization": f"Bearer {key}"}
    files = [("files", (n, (adapter_dir / n).read_bytes())) for n in ADAPTER_FILES]
    response = httpx.post(
        f"{cluster.next_api_url()}/v1/adapters", headers=headers, data={"name": name}, files=files, timeout=60
    )
    assert response.status_code in (201, 202), response.text
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(f"{cluster.next_api_url()}/v1/adapters/{name}", headers=headers, timeout=10).json()
        if body.get("latest_ready_version"):
            return
        time.sleep(0.2)
    raise AssertionError(f"adapter {name} not ready after {timeout_s:g} s: {body}")


@dataclass
class Outcome:
    """What one client received."""

    model: str
    is_stream: bool
    response_id: str | None = None
    status_code: int | None = None
    num_token_chunks: int = 0  # streamed: chunks carrying a worker delta (one token each in this engine)
    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    is_done: bool = False  # streamed: [DONE] arrived
    error: dict[str, Any] | None = None  # the error object the API sent (SSE error event or JSON body)
    transport_error: str | None = None  # the connection broke or timed out: never expected
    started_at: float = field(default_factory=time.time)
    worker_id: str | None = None  # filled in from the usage row

    @property
    def request_id(self) -> str | None:
        """The usage row's request id (the response id carries it)."""
        return None if self.response_id is None else "req-" + self.response_id.split("-", 1)[1]

    @property
    def is_ok(self) -> bool:
        """Completed normally."""
        return (
            self.status_code == 200
            and self.error is None
            and self.finish_reason is not None
            and (self.is_done or not self.is_stream)
        )


def send(
    api_url: str,
    key: str,
    model: str,
    *,
    is_stream: bool,
    max_tokens: int,
    seed: int = 0,
    out: Outcome | None = None,
) -> Outcome:
    """One completion request, recorded into `out` as it is received; every way it can end is recorded, none
    raises."""
    out = out or Outcome(model=model, is_stream=is_stream)
    body = {"model": model, "prompt": f"request {seed} counts tokens", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 1.0, "seed": seed, "stream": is_stream}  # fmt: skip
    if is_stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key}"}
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10)
    try:
        with httpx.Client(timeout=timeout) as http:
            if is_stream:
                with http.stream("POST", f"{api_url}/v1/completions", json=body, headers=headers) as response:
                    out.status_code = response.status_code
                    if response.status_code != 200:
                        out.error = _error_of(response.read())
                        return out
                    for line in response.iter_lines():
                        _on_sse_line(line, out)
            else:
                response = http.post(f"{api_url}/v1/completions", json=body, headers=headers)
                out.status_code = response.status_code
                _on_json_body(response, out)
    except httpx.HTTPError as exc:
        out.transport_error = repr(exc)
    return out


def _error_of(raw: bytes) -> dict[str, Any]:
    try:
        return dict(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        return {"type": "unparsable", "message": raw[:300].decode(errors="replace")}


def _on_json_body(response: httpx.Response, out: Outcome) -> None:
    if response.status_code != 200:
        out.error = _error_of(response.content)
        return
    body = response.json()
    out.response_id = body["id"]
    out.usage = body["usage"]
    out.finish_reason = body["choices"][0]["finish_reason"]


def _on_sse_line(line: str, out: Outcome) -> None:
    if not line.startswith("data: "):
        return
    payload = line[len("data: ") :]
    if payload == "[DONE]":
        out.is_done = True
        return
    chunk = json.loads(payload)
    if "error" in chunk:
        out.error = chunk["error"]
        return
    out.response_id = out.response_id or chunk["id"]
    if chunk.get("usage"):
        out.usage = chunk["usage"]
    for choice in chunk.get("choices", []):
        if choice["finish_reason"] is None:
            out.num_token_chunks += 1
        else:
            out.finish_reason = choice["finish_reason"]


class Load:
    """Requests sent concurrently, one thread each; `join` bounds the wait (a hung request fails the test)."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self._threads: list[threading.Thread] = []

    def start(
        self, cluster: DevCluster, key: str, model: str, *, is_stream: bool, max_tokens: int, seed: int
    ) -> None:
        """Send one request in a new thread (API replicas in turn)."""
        api_url = cluster.next_api_url()
        outcome = Outcome(model=model, is_stream=is_stream)
        self.outcomes.append(outcome)  # visible while in flight (num_token_chunks grows as chunks arrive)

        def run() -> None:
            send(api_url, key, model, is_stream=is_stream, max_tokens=max_tokens, seed=seed, out=outcome)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    def num_streamed_tokens(self) -> int:
        """Token chunks received so far by all streams."""
        return sum(o.num_token_chunks for o in self.outcomes)

    def join(self, timeout_s: float = REQUEST_TIMEOUT_S + 30) -> list[Outcome]:
        """Wait for every request; AssertionError naming how many hung."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        num_hung = sum(t.is_alive() for t in self._threads)
        assert num_hung == 0, f"{num_hung} request(s) neither completed nor failed within {timeout_s:g} s"
        return list(self.outcomes)


def usage_rows(database_url: str, tenant_id: str) -> list[UsageRecord]:
    """Every usage row of the tenant."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            return list(session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)))
    finally:
        engine.dispose()
