"""Starting vLLM for a worker (gpu_workers/worker/vllm_engine.py), without vLLM: its engine arguments follow the
settings, and the zero adapter of base-model requests has the model's shape and holds zeros."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_workers.engine.demo_model import generate_adapter
from gpu_workers.engine.errors import AdapterLoadError
from gpu_workers.worker.vllm_engine import (
    vllm_adapter_rank,
    vllm_engine_args,
    vllm_sampling_params,
    write_zero_adapter,
)
from registry.validation import BaseModelSpec, ValidationLimits
from scheduler.core.sampling import SamplingParams
from scheduler.core.structured_output import StructuredOutput
from settings import Settings


def test_vllm_engine_args_follow_the_settings(tmp_path: Path) -> None:
    args = vllm_engine_args(Settings(base_model_path=tmp_path, engine_max_loras=3, engine_max_cpu_loras=2))
    assert args["max_loras"] == 3 and args["max_cpu_loras"] == 4 and args["enable_lora"]
    assert args["max_lora_rank"] == 256 and args["enable_prefix_caching"]
    limited = Settings(
        base_model_path=tmp_path, engine_max_lora_rank=16, engine_enable_prefix_caching=False, max_rank=64
    )
    args = vllm_engine_args(limited)
    assert args["max_lora_rank"] == 16 and not args["enable_prefix_caching"]
    assert args["model"] == str(tmp_path) and args["max_num_seqs"] == Settings().engine.max_num_seqs


def test_the_zero_adapter_matches_the_models_shape_and_is_written_once(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    path = write_zero_adapter(base, tmp_path / "cache")
    tensors = load_file(str(path / "adapter_model.safetensors"))
    assert {tuple(t.shape) for t in tensors.values()} == {(8, 64), (64, 8)}
    assert all(not t.any() for t in tensors.values())
    assert write_zero_adapter(base, tmp_path / "cache") == path


def _record(**kwargs: object) -> dict[str, object]:
    return kwargs


@pytest.mark.parametrize(
    ("structured", "expected"),
    [
        (StructuredOutput("json_object"), {"json_object": True}),
        (StructuredOutput.json_schema({"type": "object"}), {"json": {"type": "object"}}),
        (StructuredOutput("regex", "[0-9]+"), {"regex": "[0-9]+"}),
        (StructuredOutput.choice(["a", "b"]), {"choice": ["a", "b"]}),
        (StructuredOutput("grammar", 'start: "x"'), {"grammar": 'start: "x"'}),
    ],
)
def test_output_constraints_map_to_vllms_structured_outputs(
    structured: StructuredOutput, expected: dict[str, object]
) -> None:
    params = SamplingParams(max_tokens=5, structured_output=structured)
    sent = vllm_sampling_params(params, _record, ("structured_outputs", _record))
    assert sent["structured_outputs"] == expected and sent["max_tokens"] == 5
    older = vllm_sampling_params(params, _record, ("guided_decoding", _record))
    assert older["guided_decoding"] == expected


def test_a_constraint_is_refused_by_a_vllm_without_structured_outputs() -> None:
    with pytest.raises(ValueError, match="structured outputs"):
        vllm_sampling_params(SamplingParams(structured_output=StructuredOutput("json_object")), _record)
    assert "structured_outputs" not in vllm_sampling_params(SamplingParams(), _record)


def test_the_vllm_worker_refuses_a_dora_adapter_saying_why(base_model_dir: Path, tmp_path: Path) -> None:
    """A second line of defence behind routing: vLLM cannot serve DoRA, so its worker refuses to load one."""
    spec, limits = BaseModelSpec.from_model_dir(base_model_dir), ValidationLimits()
    plain = generate_adapter(base_model_dir, tmp_path / "plain", 4, ("q_proj",), seed=1)
    dora = generate_adapter(base_model_dir, tmp_path / "dora", 4, ("q_proj",), seed=1, use_dora=True)
    assert vllm_adapter_rank(plain, spec, limits) == 4
    with pytest.raises(AdapterLoadError, match=r"DoRA .*vLLM cannot serve.*native worker"):
        vllm_adapter_rank(dora, spec, limits)


def test_the_vllm_worker_refuses_lora_on_embed_tokens_or_lm_head_saying_why(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """A second line of defence behind routing: vLLM's LoRA does not cover the embedding or the LM head."""
    spec, limits = BaseModelSpec.from_model_dir(base_model_dir), ValidationLimits()
    head = generate_adapter(base_model_dir, tmp_path / "head", 4, ("q_proj", "lm_head"), seed=1)
    with pytest.raises(AdapterLoadError, match=r"lm_head.*vLLM cannot serve.*native worker"):
        vllm_adapter_rank(head, spec, limits)
