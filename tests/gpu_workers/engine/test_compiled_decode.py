"""The compiled decode step on CPU (layers/pointwise.py, gpu_workers/engine/compiled_decode.py): a kernel tuner op
("decode_step": eager / compiled) measured on CPU only, kept only where it measures faster, its compile bounded
(a compile over budget loses, and the cache remembers why); an engine on it gives peft's tokens."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine import compiled_decode, kernel_plan
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.kernel_tuner import KernelChoice, KernelTuner
from gpu_workers.engine.layers.pointwise import DECODE_STEP_OP, EAGER_POINTWISE
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.loader import read_hf_config
from gpu_workers.engine.models.llama import ModelArgs
from scheduler.core.sampling import SamplingParams

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def _decode_step(config: EngineConfig, tuner: KernelTuner, device: torch.device) -> str:
    args = ModelArgs.from_hf_config(read_hf_config(config.model_path))
    return kernel_plan._decode_step(tuner, config, args, torch.float32, device, False, "sdpa")


def test_the_decode_step_is_measured_on_cpu_and_stays_eager_on_cuda(
    base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU: eager and compiled are measured; CUDA: only eager (decode steps are captured there), with why; forcing
    compiled on CUDA is refused with that reason."""
    asked: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def choose(op: str, names: tuple[str, ...], *args: Any, **kwargs: Any) -> KernelChoice:
        asked.append((tuple(names), dict(kwargs["skipped"])))
        return KernelChoice(op, names[0], skipped=dict(kwargs["skipped"]))

    tuner = KernelTuner(machine={"cpu": "test"})
    monkeypatch.setattr(tuner, "choose", choose)
    config = EngineConfig(model_path=base_model_dir)
    assert _decode_step(config, tuner, CPU) == "eager"
    assert asked[-1][0] == ("eager", "compiled") and not asked[-1][1]
    _decode_step(config, tuner, CUDA)
    assert asked[-1][0] == ("eager",) and "CUDA graphs" in asked[-1][1]["compiled"]
    with pytest.raises(ValueError, match="decode_step 'compiled' cannot run here .*CUDA graphs"):
        _decode_step(EngineConfig(model_path=base_model_dir, decode_step="compiled"), tuner, CUDA)


@pytest.mark.parametrize(("compiled_s", "expected"), [(1.0, "compiled"), (1.5, "eager")])
def test_compiled_is_kept_only_where_it_measures_faster(
    base_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    compiled_s: float,
    expected: str,
) -> None:
    """The tuner's margin decides, as for every op: compiled must beat eager by it, else eager (the simplest)."""
    monkeypatch.setattr(
        compiled_decode, "compile_pointwise", lambda args, dtype, device: (EAGER_POINTWISE, 0.1)
    )
    monkeypatch.setattr(
        KernelTuner, "measure", lambda self, candidates: {"eager": 1.5, "compiled": compiled_s}
    )
    tuner = KernelTuner(tmp_path / "choices.json", machine={"cpu": "test"})
    assert _decode_step(EngineConfig(model_path=base_model_dir), tuner, CPU) == expected


def test_a_compile_over_its_budget_loses_and_the_cache_remembers_why(
    base_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    measured: list[list[str]] = []

    def fake_measure(self: KernelTuner, candidates: dict[str, Callable[[], object]]) -> dict[str, float]:
        measured.append(list(candidates))
        return {name: 1.0 for name in candidates}

    monkeypatch.setattr(
        compiled_decode, "compile_pointwise", lambda args, dtype, device: (EAGER_POINTWISE, 9.0)
    )
    monkeypatch.setattr(KernelTuner, "measure", fake_measure)
    config = EngineConfig(model_path=base_model_dir, compile_budget_s=2.0)
    tuner = KernelTuner(tmp_path / "choices.json", machine={"cpu": "test"})
    assert _decode_step(config, tuner, CPU) == "eager" and measured == [["eager"]]
    why = tuner.choices[DECODE_STEP_OP].skipped["compiled"]
    assert "9.0 s" in why and "budget of 2 s" in why
    again = KernelTuner(tmp_path / "choices.json", machine={"cpu": "test"})
    assert _decode_step(config, again, CPU) == "eager" and measured == [["eager"]]  # cached: no compile
    assert again.choices[DECODE_STEP_OP].source == "cached"
    assert again.choices[DECODE_STEP_OP].skipped["compiled"] == why


def test_the_tuners_decode_step_candidates_run_one_layer() -> None:
    """The candidates are one decoder layer's decode step over a batch (eager here: compiling is the slow test
    below)."""
    args = ModelArgs.from_hf_config(
        {
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    )
    candidates = compiled_decode.decode_step_candidates(
        ("eager",), args, torch.float32, CPU, False, "sdpa", 3, 37, 16, 1.0
    )
    eager = candidates["eager"]
    assert callable(eager)
    out = eager()
    assert isinstance(out, torch.Tensor) and out.shape == (3, 32) and bool(out.isfinite().all())


@pytest.mark.slow
def test_an_engine_on_the_compiled_decode_step_gives_peft_tokens(
    make_engine: Callable[..., LLMEngine], hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    """Forced compiled (torch.compile'd norms, rotary and SwiGLU; compiled at start), every adapter and the base
    model in one batch decode to peft's greedy tokens."""
    engine = functools.partial(make_engine, device="cpu")(decode_step="compiled")
    stats = engine.runner_stats()
    assert stats.kernel_choices[DECODE_STEP_OP] == "compiled"
    assert stats.decode_step_compile_s is not None and stats.decode_step_compile_s > 0
    adapters: list[str | None] = [None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for prompt, adapter, out in zip(
        prompts, adapters, engine.generate(prompts, greedy, adapter_ids=adapters)
    ):
        assert out.token_ids == hf_oracle.greedy(prompt, adapter, 4), adapter
