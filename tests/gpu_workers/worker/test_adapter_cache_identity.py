"""Adapter versions that share weights but not adapter_config.json never share a cached config (issue 13).

Every worker cache (host files, engine residency) must tell such versions apart: each is served with its own
lora_alpha, equal to transformers + peft on its own files, also after a worker restart over the same cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import torch

from cluster.protocol import AdapterRef, GenerateEvent, GenerateRequest
from tests.gpu_workers.conftest import PROMPTS, HfOracle
from tests.worker_harness import RunningWorker, put_adapter, worker_in_thread

NUM_TOKENS = 8
ALPHAS = {"alpha-low": 1, "alpha-high": 64}  # same weights (r=8): scale 0.125 vs 8


def _with_alpha(source: Path, dest: Path, alpha: int) -> Path:
    """A copy of a PEFT directory with the same weights and another lora_alpha."""
    shutil.copytree(source, dest)
    config_path = dest / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["lora_alpha"] = alpha
    config_path.write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="module")
def variant_dirs(adapter_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two PEFT directories with identical adapter_model.safetensors and different lora_alpha."""
    root = tmp_path_factory.mktemp("variants")
    return {name: _with_alpha(adapter_dirs["adapter-01"], root / name, a) for name, a in ALPHAS.items()}


@pytest.fixture(scope="module")
def variant_oracle(base_model_dir: Path, variant_dirs: dict[str, Path]) -> HfOracle:
    """transformers + peft over the two variants."""
    return HfOracle(base_model_dir, variant_dirs, torch.float32)


def _greedy_ids(worker: RunningWorker, ref: AdapterRef, request_id: str) -> list[int]:
    body = GenerateRequest(
        request_id=request_id,
        prompt=PROMPTS[0],
        adapter=ref,
        sampling={"max_tokens": NUM_TOKENS, "temperature": 0, "ignore_eos": True},
    ).model_dump(mode="json")
    with worker.client(timeout=60) as client, client.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200, response.read()
        events = [GenerateEvent.model_validate_json(line) for line in response.iter_lines() if line]
    assert events[-1].type == "final", events[-1]
    return [t for e in events for t in e.token_ids]


def _expected(oracle: HfOracle, worker: RunningWorker, name: str) -> list[int]:
    prompt_ids = worker.extra["embedded"].runtime.service.engine.tokenizer.encode(PROMPTS[0])
    return oracle.greedy(prompt_ids, name, NUM_TOKENS)


def test_same_weights_different_alpha_are_each_served_with_their_own_config(
    worker: RunningWorker, blob_dir: Path, variant_dirs: dict[str, Path], variant_oracle: HfOracle
) -> None:
    refs = {name: put_adapter(blob_dir, f"tenant-{name}", path) for name, path in variant_dirs.items()}
    assert len({ref.sha256 for ref in refs.values()}) == 1  # the weights are identical

    served = {name: _greedy_ids(worker, ref, f"identity-{name}") for name, ref in refs.items()}

    expected = {name: _expected(variant_oracle, worker, name) for name in refs}
    assert expected["alpha-low"] != expected["alpha-high"]  # the test can tell the configs apart
    assert served == expected


def test_restarted_worker_does_not_serve_a_cached_config_of_another_version(
    base_model_dir: Path, tmp_path: Path, variant_dirs: dict[str, Path], variant_oracle: HfOracle
) -> None:
    blobs, data_dir = tmp_path / "blobs", tmp_path / "worker-data"
    first = put_adapter(blobs, "tenant-b", variant_dirs["alpha-low"])
    with worker_in_thread(base_model_dir, blobs, data_dir=data_dir) as worker:
        _greedy_ids(worker, first, "before-restart")
    second = put_adapter(blobs, "tenant-c", variant_dirs["alpha-high"])
    with worker_in_thread(base_model_dir, blobs, data_dir=data_dir) as worker:
        served = _greedy_ids(worker, second, "after-restart")
        assert served == _expected(variant_oracle, worker, "alpha-high")


def test_tampered_config_blob_is_adapter_unavailable(
    worker: RunningWorker, blob_dir: Path, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    uploaded = _with_alpha(adapter_dirs["adapter-01"], tmp_path / "alpha-2", 2)  # a config no other test uses
    ref = put_adapter(blob_dir, "tenant-tampered", uploaded)
    swapped = _with_alpha(adapter_dirs["adapter-01"], tmp_path / "alpha-64", 64)
    shutil.copyfile(swapped / "adapter_config.json", blob_dir / ref.config_blob_key)  # same weights
    body = GenerateRequest(request_id="tampered", prompt=PROMPTS[0], adapter=ref).model_dump(mode="json")
    response = httpx.post(f"{worker.url}/internal/v1/generate", json=body, headers=worker.headers, timeout=60)
    assert response.status_code == 424
    message = response.json()["error"]["message"]
    assert "checksum mismatch" in message and "adapter_config.json" in message
