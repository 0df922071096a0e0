"""Frozen engine configuration, built once by the entry point and never mutated."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationInfo, field_validator

from settings.api import DEFAULT_MAX_LORA_RANK
from settings.engine import EngineSettings
from settings.engine_kernels import DTYPE_NAMES

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
# Default adapter room (adapter_cache_bytes None): this many adapters of max_lora_rank on every projection.


class EngineConfig(EngineSettings):
    """Everything the native engine needs: the engine section of the settings (settings/engine.py: every
    operator knob, validated there) plus the model path, the rank limit and knobs only code sets; validated at
    construction (a ValueError naming the field), frozen.

    KV memory: `num_kv_blocks` wins when set, else `kv_cache_bytes` is divided into blocks.
    `max_num_batched_tokens` is the per-step token budget (prefill chunks + decodes).
    `max_running_tokens` bounds the running batch's tokens at admission (scheduler/admission/running_budget.py; None:
    no bound), so requests wait where the batch policy orders them.
    `max_model_len` None means the model's max_position_embeddings (capped by the KV capacity).
    `lora_stack_cache_size`: how many stacked adapter sets (one per batch composition, used by decode-sized
    steps) are cached; 0 disables the stacked LoRA form.
    `packed_linears`: run projections on oneDNN-packed weights (CPU); None = auto (bf16 with native support).
    `lora_kernel`: LoRA deltas of decode-sized segments (<= 16 tokens per adapter) through the C/OpenMP CPU
    kernel (layers/lora_kernel.py; layers/cpu_kernels.py compiles it at start and caches it); None = auto (on
    CPU, bf16 or fp32, when it builds), False = the torch forms (stacked / per segment).
    `tune_host_malloc`: on CPU, keep large temporaries on glibc's heap instead of fresh mmaps (process-wide,
    gpu_workers/engine/host_malloc.py), so per-step GEMM outputs are not page-faulted in again on every call.
    `fp32_prefill_gemms`: with packed linears in bf16, products of >= 128 rows (prefill) multiply fp32 upcasts
    of the activations and weights and round the output to bf16 (the dense bf16 weights are kept beside the
    packed ones: 2x their memory); None = auto: chosen by measurement on this machine and the model's shapes
    (gpu_workers/engine/kernel_tuner.py; cached in `kernel_choices_path`, default
    $LORAHOST_ENGINE_KERNEL_CHOICES_PATH or ~/.cache/lorahost/kernel_choices.json).
    `prefill_gemm`, `decode_attention`, `prefill_attention`, `decode_lora_form` force the implementation of those
    ops (one of PREFILL_GEMM_FORMS, DECODE_ATTENTION_FORMS, PREFILL_ATTENTION_FORMS, DECODE_LORA_FORMS;
    gpu_workers/engine/kernel_plan.py); None = chosen by the kernel tuner. `prefill_gemm` wins over
    `fp32_prefill_gemms` (True = "fp32_upcast", False = "packed"); `lora_kernel` True = decode_lora_form
    "kernel", False = never the kernel. `decode_step` forces "eager" / "compiled" (CPU: a decoder layer's
    elementwise runs through torch.compile, layers/pointwise.py; measured otherwise, the compile bounded by
    `compile_budget_s`).
    `cuda_graphs`, `cuda_graph_max_batch_size`, `cuda_graph_capture_budget_s`, `cuda_graph_max_pool_bytes`: decode
    steps captured in CUDA graphs at start, one per padded batch-size bucket (gpu_workers/engine/decode_graphs.py);
    no effect on CPU.

    Device memory is one page pool (scheduler/core/page_pool.py), a page being one KV block; `memory_mode`:
    - "unified" (default; S-LoRA / FastLibra): one budget of KV pages (`num_kv_blocks`, else
      `kv_cache_bytes`) plus `adapter_cache_bytes` (default 0) worth of pages, all in the KV tensor; KV blocks
      and adapter weights share every page, no fixed adapter share: a resident adapter's tensors live in a
      contiguous run of pages (gpu_workers/engine/adapter_layout.py), so KV + adapters never exceed the budget.
    - "static" (vLLM-style baseline): the KV pages above, and a fixed adapter share of `adapter_cache_bytes`
      (None = room for `DEFAULT_NUM_ADAPTERS_ROOM` (64) adapters of `max_lora_rank` on every projection;
      smaller ranks take fewer pages, so more fit) holding adapters as tensors of their own; neither side
      borrows from the other.
    Either way the pool is the only limit on how many adapters are on the device: a request whose adapter
    does not fit right now waits in the engine's queue.
    `batch_policy` names the admission policy (scheduler/admission/batch_policy.py BATCH_POLICIES); the
    `multiqueue_*` knobs configure "multiqueue" (scheduler/multiqueue/multiqueue.py): the TTFT SLO of its M/M/1 quota
    rule, how often its size classes and quotas are refreshed, and its most queues (Kmax);
    `fair_share`: wrap that policy in the tenants' fair share (scheduler/admission/fair_share.py: the least-served
    tenant's requests first, in the policy's order within a tenant; no effect with one tenant), keeping
    `fair_share_reserved_seqs` batch slots for a tenant with nothing running (a newcomer is admitted at the
    next step instead of waiting for another tenant's request to finish; at most max_num_seqs - 1);
    `adapter_eviction_policy` the order in which idle adapters leave the device when pages are needed
    (scheduler/cache/eviction.py EVICTION_POLICIES: lru, chameleon, fastlibra).
    `is_caching_idle_adapters`: keep adapters no request uses on the device while pages are free (the
    adapter cache, default); False evicts an adapter as soon as no running or waiting request (or lease)
    uses it, so every later request for it copies it again (the S-LoRA / no-cache baseline of
    benchmarks/scheduling.py; explicit loads and prefetch hints then last only until the next step).
    `enable_prefix_caching`: reuse the KV of full prompt blocks shared with an earlier request of the same
    adapter id and cache namespace (scheduler/core/prefix_cache.py: one namespace per tenant unless an operator
    shares one, so a hit never tells a tenant what another sent); cached blocks are dropped when their adapter
    leaves the device.

    `host_adapter_cache_bytes`: the host tier below the device (scheduler/core/host_tier.py): packed host
    copies of recently copied adapters, so a later copy skips reading, validating and packing the files
    (0 disables it; the worker's disk cache is the tier below).
    Adapter loads run off the step loop (gpu_workers/engine/adapter_copier.py: the host copy is read,
    validated and packed on a preparer thread, then copied host -> device on a copy thread).
    `adapter_link_gbps` emulates the link's bandwidth in GB/s (10^9 bytes/s; a copy of n bytes takes at least
    n / bandwidth seconds; None = as fast as the machine copies). `cpu_prefill_workers` CPU threads compute
    the LoRA delta of prefills whose adapter is still copying from its host copy (CPU-assisted prefill, one
    worker per prefill entry); 0 disables it: such requests wait for the copy. Default 2: two cores of the
    host are enough for a few concurrent cold prompts of a small rank (CaraServe), and take little from the
    CPU device's own threads otherwise.
    """

    model_path: Path
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    block_size: int = 16
    lora_stack_cache_size: int = 2
    packed_linears: bool | None = None
    tune_host_malloc: bool = True
    seed: int = 0

    @field_validator("max_lora_rank", "block_size")
    @classmethod
    def _check_positive_size(cls, value: int, info: ValidationInfo) -> int:
        if value <= 0:
            raise ValueError(f"{info.field_name} must be positive, got {value}")
        return value

    @field_validator("lora_stack_cache_size")
    @classmethod
    def _check_stack_cache_size(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"lora_stack_cache_size must be >= 0, got {value}")
        return value

    @classmethod
    def from_section(cls, engine: EngineSettings, *, model_path: Path, max_lora_rank: int) -> EngineConfig:
        """The config of an engine built from the settings' engine section, for this model and rank limit (the
        section's own `max_lora_rank` when set)."""
        values = dict(engine)
        section_rank = values.pop("max_lora_rank")
        return cls(model_path=model_path, max_lora_rank=section_rank or max_lora_rank, **values)

    def resolved_device(self) -> torch.device:
        """cuda when requested or available (auto), else cpu."""
        if self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available()):
            return torch.device("cuda")
        return torch.device("cpu")

    def resolved_dtype(self) -> torch.dtype:
        """The compute dtype; auto = bf16 on CUDA or on a CPU with fast bf16, else fp32."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if self.resolved_device().type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if _cpu_has_fast_bf16() else torch.float32


def _cpu_has_fast_bf16() -> bool:
    """True when oneDNN reports native bf16 support (AVX512-BF16 / AMX)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
