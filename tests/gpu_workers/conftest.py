"""Engine test fixtures: engines over the tiny demo model and a transformers + peft oracle."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from tests.worker_harness import RunningWorker, worker_in_thread

PROMPTS = [
    "hello world the river",
    "tenant cache memory batch queue worker latency",
    "one two three",
    "the a an of to in for on with as by at from about into over after lora adapter model token",
]


@pytest.fixture(scope="session")
def make_engine(base_model_dir: Path, adapter_dirs: dict[str, Path]) -> Callable[..., LLMEngine]:
    """Factory: an engine over the tiny model with every demo adapter loaded (kwargs go to EngineConfig). The decode
    step is eager unless a test asks otherwise: measuring it compiles (seconds; tests/gpu_workers/engine/
    test_compiled_decode.py tests that choice)."""

    def make(**kwargs: Any) -> LLMEngine:
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("decode_step", "eager")
        engine = LLMEngine(EngineConfig(model_path=base_model_dir, **kwargs))
        for name, path in adapter_dirs.items():
            engine.load_adapter(name, path)
        return engine

    return make


@pytest.fixture(scope="session")
def fp32_engine(make_engine: Callable[..., LLMEngine]) -> LLMEngine:
    """A shared fp32 engine (tests using it must leave it idle)."""
    return make_engine()


@pytest.fixture(scope="session")
def tokenizer(fp32_engine: LLMEngine) -> Any:
    """The demo tokenizer."""
    return fp32_engine.tokenizer


@pytest.fixture(scope="session")
def prompt_ids(tokenizer: Any) -> list[list[int]]:
    """Token ids of PROMPTS (with BOS)."""
    return [tokenizer.encode(p) for p in PROMPTS]


class HfOracle:
    """transformers + peft on the same files: greedy tokens and logits per adapter (None = base)."""

    def __init__(self, base_dir: Path, adapter_dirs: dict[str, Path], dtype: torch.dtype) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype)
        names = list(adapter_dirs)
        self.model = PeftModel.from_pretrained(base, str(adapter_dirs[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            self.model.load_adapter(str(adapter_dirs[name]), adapter_name=name)
        self.model.eval()

    @torch.inference_mode()
    def logits(self, token_ids: list[int], adapter: str | None) -> torch.Tensor:
        """Next-token logits [vocab] (fp32) after token_ids."""
        x = torch.tensor([token_ids])
        if adapter is None:
            with self.model.disable_adapter():
                return self.model(input_ids=x).logits[0, -1].float()
        self.model.set_adapter(adapter)
        return self.model(input_ids=x).logits[0, -1].float()

    def first_divergence_gap(
        self, token_ids: list[int], adapter: str | None, got: list[int], expected: list[int]
    ) -> float:
        """0.0 if `got` equals the greedy `expected`; else, at the first token where they differ, how far
        `got`'s logit is below the greedy one's (a near-tie that fp32 summation order can flip is tiny)."""
        for k, (a, b) in enumerate(zip(got, expected, strict=True)):
            if a != b:
                logits = self.logits([*token_ids, *expected[:k]], adapter)
                return float(logits[b] - logits[a])
        return 0.0

    def greedy(self, token_ids: list[int], adapter: str | None, num_tokens: int) -> list[int]:
        """Greedy continuation (no EOS stop), recomputing the full prefix each step."""
        ids = list(token_ids)
        for _ in range(num_tokens):
            ids.append(int(self.logits(ids, adapter).argmax()))
        return ids[len(token_ids) :]


@pytest.fixture(scope="session")
def hf_oracle(base_model_dir: Path, adapter_dirs: dict[str, Path]) -> HfOracle:
    """fp32 transformers + peft oracle with every demo adapter."""
    return HfOracle(base_model_dir, adapter_dirs, torch.float32)


@pytest.fixture(scope="module")
def blob_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local blob-store directory for one test module's worker."""
    return tmp_path_factory.mktemp("worker-blobs")


@pytest.fixture(scope="module")
def worker(base_model_dir: Path, blob_dir: Path) -> Iterator[RunningWorker]:
    """A real worker (tiny model) running in a thread, one per test module."""
    with worker_in_thread(base_model_dir, blob_dir) as running:
        yield running
