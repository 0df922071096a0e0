"""Crash-safe metering, end to end (issue 7 item 6): `kill -9` of `lorahost serve` while 10 streams are
flowing, restart on the same data dir, and every request has exactly one usage row, `interrupted`, billed
within one checkpoint of what its client received.

Bounds checked per stream (client and server share the machine's clock):
- billed completion tokens <= tokens the client received (a checkpoint never counts a token that was not
  handed to the client; the client reads until the connection drops, so nothing handed over is missed);
- billed completion tokens >= tokens the client received before the row's last checkpoint, minus one chunk
  (the chunk a stream may have sent but not yet counted when the checkpoint read its count).
No timing threshold: the waits are bounded, and the kill comes as soon as every stream got a token and one of
the streams' rows holds a checkpoint (read from the database, not guessed from a delay: a fixed delay let a
fast machine reach its kill point before the first checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from lorahost.demo import free_port, setup_tenant, wait_ready
from registry.db import make_engine, make_session_factory
from registry.models import UsageRecord

pytestmark = pytest.mark.slow  # starts lorahost serve subprocesses killed with SIGKILL

NUM_STREAMS = 10
MAX_TOKENS = 900  # the tiny model's context is 1024: long enough for several checkpoints on a fast machine
CHECKPOINT_INTERVAL_S = 0.2
ADMIN_KEY = "crash-admin-key"
WAIT_S = 180.0


@dataclass
class ClientStream:
    """What one client received: (receipt time, tokens) per chunk, the response id, and how it ended."""

    response_id: str | None = None
    receipts: list[tuple[float, int]] = field(default_factory=list)
    is_done: bool = False
    error: str | None = None

    @property
    def num_received(self) -> int:
        return sum(n for _, n in self.receipts)

    def num_received_before(self, moment: float) -> int:
        return sum(n for at, n in self.receipts if at < moment)

    def max_chunk_tokens(self) -> int:
        return max((n for _, n in self.receipts), default=0)


def _stream(url: str, key: str, seed: int, out: ClientStream) -> None:
    body = {
        "model": "lorahost-base",
        "prompt": "count the tokens",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
    }
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(WAIT_S, connect=30)) as http,
            http.stream(
                "POST", f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as response,
        ):
            response.raise_for_status()
            for line in response.iter_lines():
                _on_line(line, out)
    except httpx.HTTPError as exc:  # the kill: the connection drops mid-stream
        out.error = repr(exc)


def _on_line(line: str, out: ClientStream) -> None:
    if line == "data: [DONE]":
        out.is_done = True
    elif line.startswith("data: {"):
        chunk = json.loads(line[len("data: ") :])
        out.response_id = out.response_id or chunk["id"]
        if chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
            out.receipts.append((time.time(), 1))  # one chunk per worker delta, one token per decode step


def _serve(data_dir: Path, port: int, base_model_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "LORAHOST_ADMIN_KEY": ADMIN_KEY,
        "LORAHOST_USAGE_CHECKPOINT_INTERVAL_S": str(CHECKPOINT_INTERVAL_S),
    }
    cmd = [
        sys.executable,
        "-m",
        "lorahost.cli",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--base-model",
        str(base_model_dir),
    ]
    return subprocess.Popen(cmd, env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)


def _wait_served(url: str, key: str) -> None:
    """Until a completion succeeds (the in-process worker has loaded its model)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        r = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
            json={"model": "lorahost-base", "prompt": "warm up", "max_tokens": 2},
        )
        if r.status_code == 200:
            return
        time.sleep(0.5)
    pytest.fail("the worker never served a request")


def _wait_until(predicate, timeout_s: float = WAIT_S) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _start_streams(url: str, key: str) -> tuple[list[ClientStream], list[threading.Thread]]:
    streams = [ClientStream() for _ in range(NUM_STREAMS)]
    threads = [
        threading.Thread(target=_stream, args=(url, key, i, s), daemon=True) for i, s in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    return streams, threads


def _kill_mid_stream(proc: subprocess.Popen[bytes], data_dir: Path, streams: list[ClientStream]) -> None:
    """SIGKILL once every stream got a token and an open row of this run holds a checkpointed token count."""
    assert _wait_until(lambda: all(s.num_received > 0 for s in streams)), "not every stream got a token"
    response_ids = {f"req-{s.response_id.split('-', 1)[1]}" for s in streams if s.response_id}

    def is_checkpointed() -> bool:
        return any(
            r.request_id in response_ids and r.status == "in_progress" and r.completion_tokens > 0
            for r in _rows(data_dir)
        )

    assert _wait_until(is_checkpointed), "no open row was ever checkpointed"
    assert not all(s.is_done for s in streams), "every stream finished before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _rows(data_dir: Path) -> list[UsageRecord]:
    engine = make_engine(f"sqlite:///{(data_dir / 'lorahost.db').resolve()}")
    try:
        with make_session_factory(engine)() as session:
            return list(session.scalars(select(UsageRecord)))
    finally:
        engine.dispose()


def _check_interrupted(row: UsageRecord, stream: ClientStream) -> None:
    assert row.status == "interrupted", (row.status, row.error_message)
    assert row.completion_tokens <= stream.num_received, (row.completion_tokens, stream.num_received)
    if row.checkpointed_at is None:
        assert row.completion_tokens == 0
        return
    received_before = stream.num_received_before(row.checkpointed_at.timestamp())
    assert row.completion_tokens >= received_before - stream.max_chunk_tokens(), (
        row.completion_tokens,
        received_before,
    )
    assert row.prompt_tokens > 0 or row.completion_tokens == 0


def test_kill_9_mid_stream_then_restart_bills_every_request_once_to_its_last_checkpoint(
    tmp_path: Path, base_model_dir: Path
) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(data_dir, port, base_model_dir, log_path)
    try:
        wait_ready(url, proc, timeout_s=WAIT_S)
        tenant_id, key = setup_tenant(url, ADMIN_KEY)
        _wait_served(url, key)
        streams, threads = _start_streams(url, key)
        _kill_mid_stream(proc, data_dir, streams)
        for thread in threads:
            thread.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert all(s.response_id for s in streams)
    stale = {r.request_id: r.status for r in _rows(data_dir) if r.status == "in_progress"}
    assert len(stale) >= 1, "the killed process left no open rows: nothing was in flight?"

    proc = _serve(data_dir, port, base_model_dir, log_path)
    try:
        wait_ready(url, proc, timeout_s=WAIT_S)  # the restart sweep runs before the API answers
        usage = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {key}"}, timeout=60).json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    rows = {r.request_id: r for r in _rows(data_dir) if r.tenant_id == tenant_id}
    by_request = {f"req-{s.response_id.split('-', 1)[1]}": s for s in streams}  # type: ignore[union-attr]
    assert set(by_request) <= set(rows)  # every stream has its row (the warm-up request has one too)
    assert sum(1 for r in _rows(data_dir) if r.request_id in by_request) == NUM_STREAMS  # exactly one each
    for request_id, stream in by_request.items():
        row = rows[request_id]
        if stream.is_done:  # a fast machine finished it before the kill
            assert (row.status, row.completion_tokens) == ("ok", MAX_TOKENS)
        else:
            _check_interrupted(row, stream)
    interrupted = [rows[r] for r, s in by_request.items() if not s.is_done]
    assert interrupted and any(r.completion_tokens > 0 for r in interrupted), "no stream was checkpointed"
    assert not any(r.status == "in_progress" for r in _rows(data_dir))
    billed = sum(r.completion_tokens for r in rows.values())
    assert usage["total_completion_tokens"] == billed
    statuses = usage["data"][0]["by_status"]
    assert statuses.get("interrupted", 0) == len(interrupted)
    assert "closed" in log_path.read_text() and "interrupted" in log_path.read_text()
    assert datetime.now(UTC) > max(r.started_at for r in interrupted)
