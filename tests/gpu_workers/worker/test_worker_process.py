"""A real `lorahost worker` process: Redis membership, SIGTERM drain (in-flight stream finishes), exit 0."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.protocol import GenerateEvent, GenerateRequest
from tests.polling import wait_for
from tests.services import REDIS_URL, redis_with_prefix
from tests.worker_harness import RunningWorker, worker_process

pytestmark = pytest.mark.slow  # starts worker subprocesses (SIGTERM drain, refused start)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    for _, prefix in redis_with_prefix():
        yield prefix


def _stream_events(
    worker: RunningWorker, max_tokens: int, first_delta: threading.Event
) -> list[GenerateEvent]:
    body = GenerateRequest(
        request_id="in-flight",
        prompt="hello world",
        sampling={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    ).model_dump(mode="json")
    events = []
    with worker.client(timeout=120) as client, client.stream("POST", "/generate", json=body) as response:
        for line in response.iter_lines():
            if line:
                events.append(GenerateEvent.model_validate_json(line))
                first_delta.set()
    return events


def test_sigterm_drains_in_flight_stream_then_exits_0_and_deregisters(
    base_model_dir: Path, tmp_path: Path, redis_prefix: str
) -> None:
    with worker_process(
        base_model_dir, tmp_path / "blobs", redis_url=REDIS_URL, worker_key_prefix=redis_prefix
    ) as worker:
        assert worker.directory is not None and worker.process is not None
        assert wait_for(lambda: [r.worker_id for r in worker.directory.list_live()] == [worker.worker_id])

        first_delta = threading.Event()
        result: list[list[GenerateEvent]] = []
        reader = threading.Thread(target=lambda: result.append(_stream_events(worker, 1000, first_delta)))
        reader.start()
        assert first_delta.wait(60)
        worker.process.send_signal(signal.SIGTERM)

        with worker.client(timeout=10) as client:
            assert wait_for(lambda: client.get("/ready").status_code == 503)
            assert client.get("/ready").json()["status"] == "draining"
            refused = client.post("/generate", json={"request_id": "late", "prompt": "hi"})
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "draining"
            # /ready flips before the drain's heartbeat reaches the directory: wait for that beat.
            assert wait_for(lambda: [r.is_draining for r in worker.directory.list_live()] == [True])
            [record] = worker.directory.list_live()
            assert record.is_draining and not record.is_ready

        reader.join(60)
        assert worker.process.wait(60) == 0
        *deltas, final = result[0]
        assert final.type == "final" and final.finish_reason == "length"
        assert final.num_output_tokens == sum(len(e.token_ids) for e in deltas) > 900
        assert worker.directory.list_live() == []
        assert b"draining" in worker.log_path.read_bytes()


def test_worker_refuses_to_start_without_an_internal_token(base_model_dir: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {"LORAHOST_BASE_MODEL_PATH": str(base_model_dir), "LORAHOST_DATA_DIR": str(tmp_path), "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "lorahost.cli", "worker"],
        check=False,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode != 0 and b"LORAHOST_INTERNAL_TOKEN" in done.stdout + done.stderr
