"""The engine over tensors handed to it instead of files, as benchmarks/gpu_engine_bench.py builds an 8B-shaped
model on the device: the model runner's `weights` (the model directory holds only config.json) and adapters
packed from tensors (`AdapterTransfers.pack_adapter` + `install_adapter`). Both give the files' tokens."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.loader import iter_safetensors, safetensors_files
from gpu_workers.engine.model_runner import ModelRunner
from registry.validation import parse_lora_tensor_name
from scheduler.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _config_only_dir(base_model_dir: Path, out: Path) -> Path:
    """A copy of the model directory without its weight files."""
    out.mkdir()
    for path in base_model_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    return out


def _tokens(engine: LLMEngine, prompts: list[list[int]], adapter: str | None) -> list[list[int]]:
    outs = engine.generate(prompts, GREEDY, adapter_ids=[adapter] * len(prompts))
    return [list(o.token_ids) for o in outs]


def test_runner_runs_on_handed_weights_where_the_directory_has_none(
    base_model_dir: Path, tmp_path: Path, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    config = EngineConfig(
        model_path=_config_only_dir(base_model_dir, tmp_path / "config-only"),
        dtype="float32",
        num_kv_blocks=256,
    )
    with pytest.raises(FileNotFoundError, match="safetensors"):
        ModelRunner(config)
    runner = ModelRunner(config, weights=iter_safetensors(safetensors_files(base_model_dir)))
    engine = LLMEngine(config, executor=runner, tokenizer=fp32_engine.tokenizer)
    assert _tokens(engine, prompt_ids, None) == _tokens(fp32_engine, prompt_ids, None)


def _lora_pairs(adapter_dir: Path, num_layers: int) -> list[dict]:
    """Per layer: module -> (lora_A, lora_B), read from the adapter's safetensors."""
    halves: list[dict[str, dict]] = [{} for _ in range(num_layers)]
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            layer, module, side = parse_lora_tensor_name(name)
            halves[layer].setdefault(module, {})[side] = f.get_tensor(name)
    return [{m: (s["A"], s["B"]) for m, s in layer.items()} for layer in halves]


@pytest.mark.parametrize("name", ["adapter-02", "adapter-03"])  # all seven projections; the MLP with rsLoRA
def test_adapter_packed_from_tensors_gives_the_tokens_of_its_files(
    make_engine: Callable[..., LLMEngine],
    adapter_dirs: dict[str, Path],
    prompt_ids: list[list[int]],
    name: str,
) -> None:
    engine = make_engine()
    info = engine.inspect_adapter(adapter_dirs[name])
    pairs = _lora_pairs(adapter_dirs[name], engine.runner.args.num_layers)
    adapter = engine.runner.transfers.pack_adapter("from-tensors", pairs, info.rank, info.scale)
    assert adapter.target_modules == tuple(sorted(info.target_modules))
    engine.install_adapter(adapter)
    assert engine.adapter_residency("from-tensors") == "device"
    from_tensors = _tokens(engine, prompt_ids, "from-tensors")
    assert from_tensors == _tokens(engine, prompt_ids, name)
    assert from_tensors != _tokens(engine, prompt_ids, None)
