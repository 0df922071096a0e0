"""Frozen engine configuration, built once by the entry point and never mutated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scheduler.eviction import DEFAULT_EVICTION_POLICY, EVICTION_POLICIES
from scheduler.multiqueue import DEFAULT_MAX_QUEUES, DEFAULT_REFRESH_S, DEFAULT_SLO_S

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Default adapter room (adapter_cache_bytes None): this many adapters of max_lora_rank on every projection.
DEFAULT_NUM_ADAPTERS_ROOM = 64
MEMORY_MODES = ("unified", "static")  # see EngineConfig
# Forced kernel choices (gpu_workers/kernel_plan.py): setting -> its forms (= the ops' forms in gpu_workers/layers/)
KERNEL_FORMS = {
    "prefill_gemm": ("packed", "fp32_upcast", "plain"),
    "decode_attention": ("sdpa", "sdpa_fp32", "grouped_matmul", "c_kernel"),
    "decode_lora_form": ("segmented", "stacked", "kernel"),
}


@dataclass(frozen=True)
class EngineConfig:
    """Everything the native engine needs; validated at construction.

    KV memory: `num_kv_blocks` wins when set, else `kv_cache_bytes` is divided into blocks.
    `max_num_batched_tokens` is the per-step token budget (prefill chunks + decodes).
    `max_model_len` None means the model's max_position_embeddings (capped by the KV capacity).
    `lora_stack_cache_size`: how many stacked adapter sets (one per batch composition, used by decode-sized
    steps) are cached; 0 disables the stacked LoRA form.
    `packed_linears`: run projections on oneDNN-packed weights (CPU); None = auto (bf16 with native support).
    `lora_kernel`: LoRA deltas of decode-sized segments (<= 16 tokens per adapter) through the C/OpenMP CPU
    kernel (layers/lora_kernel.py; layers/cpu_kernels.py compiles it at start and caches it); None = auto (on
    CPU, bf16 or fp32, when it builds), False = the torch forms (stacked / per segment).
    `tune_host_malloc`: on CPU, keep large temporaries on glibc's heap instead of fresh mmaps (process-wide,
    gpu_workers/host_malloc.py), so per-step GEMM outputs are not page-faulted in again on every call.
    `fp32_prefill_gemms`: with packed linears in bf16, products of >= 128 rows (prefill) multiply fp32 upcasts
    of the activations and weights and round the output to bf16 (the dense bf16 weights are kept beside the
    packed ones: 2x their memory); None = auto: chosen by measurement on this machine and the model's shapes
    (gpu_workers/kernel_tuner.py; cached in `kernel_choices_path`, default
    $LORAHOST_ENGINE_KERNEL_CHOICES_PATH or ~/.cache/lorahost/kernel_choices.json).
    `prefill_gemm`, `decode_attention`, `decode_lora_form` force the implementation of those ops (one of
    PREFILL_GEMM_FORMS, DECODE_ATTENTION_FORMS, DECODE_LORA_FORMS; gpu_workers/kernel_plan.py); None = chosen by
    the kernel tuner. `prefill_gemm` wins over `fp32_prefill_gemms` (True = "fp32_upcast", False = "packed");
    `lora_kernel` True = decode_lora_form "kernel", False = never the kernel.

    Device memory is one page pool (scheduler/core/page_pool.py), a page being one KV block; `memory_mode`:
    - "unified" (default; S-LoRA / FastLibra): one budget of KV pages (`num_kv_blocks`, else
      `kv_cache_bytes`) plus `adapter_cache_bytes` (default 0) worth of pages, all in the KV tensor; KV blocks
      and adapter weights share every page, no fixed adapter share: a resident adapter's tensors live in a
      contiguous run of pages (gpu_workers/adapter_layout.py), so KV + adapters never exceed the budget.
    - "static" (vLLM-style baseline): the KV pages above, and a fixed adapter share of `adapter_cache_bytes`
      (None = room for `DEFAULT_NUM_ADAPTERS_ROOM` (64) adapters of `max_lora_rank` on every projection;
      smaller ranks take fewer pages, so more fit) holding adapters as tensors of their own; neither side
      borrows from the other.
    Either way the pool is the only limit on how many adapters are on the device: a request whose adapter
    does not fit right now waits in the engine's queue.
    `batch_policy` names the admission policy (scheduler/batch_policy.py BATCH_POLICIES); the
    `multiqueue_*` knobs configure "multiqueue" (scheduler/multiqueue.py): the TTFT SLO of its M/M/1 quota
    rule, how often its size classes and quotas are refreshed, and its most queues (Kmax);
    `fair_share`: wrap that policy in the tenants' fair share (scheduler/fair_share.py: the least-served
    tenant's requests first, in the policy's order within a tenant; no effect with one tenant), keeping
    `fair_share_reserved_seqs` batch slots for a tenant with nothing running (a newcomer is admitted at the
    next step instead of waiting for another tenant's request to finish; at most max_num_seqs - 1);
    `adapter_eviction_policy` the order in which idle adapters leave the device when pages are needed
    (scheduler/eviction.py EVICTION_POLICIES: lru, chameleon, fastlibra).
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
    Adapter copies host -> device are asynchronous (gpu_workers/adapter_copier.py). `adapter_link_gbps`
    emulates the link's bandwidth in GB/s (10^9 bytes/s; a copy of n bytes takes at least n / bandwidth
    seconds; None = as fast as the machine copies). `cpu_prefill_workers` CPU threads compute the LoRA delta
    of prefills whose adapter is still copying from its host copy (CPU-assisted prefill, one worker per
    prefill entry); 0 disables it: such requests wait for the copy. Default 2: two cores of the host are
    enough for a few concurrent cold prompts of a small rank (CaraServe), and take little from the CPU
    device's own threads otherwise.
    """

    model_path: Path | str
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 1 << 30
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_model_len: int | None = None
    max_lora_rank: int = 256
    adapter_cache_bytes: int | None = None
    memory_mode: str = "unified"
    batch_policy: str = "fifo"
    fair_share: bool = True
    fair_share_reserved_seqs: int = 1
    multiqueue_slo_s: float = DEFAULT_SLO_S
    multiqueue_refresh_s: float = DEFAULT_REFRESH_S
    multiqueue_max_queues: int = DEFAULT_MAX_QUEUES
    adapter_eviction_policy: str = DEFAULT_EVICTION_POLICY
    is_caching_idle_adapters: bool = True
    enable_prefix_caching: bool = True
    num_threads: int | None = None
    lora_stack_cache_size: int = 2
    packed_linears: bool | None = None
    fp32_prefill_gemms: bool | None = None
    kernel_choices_path: Path | None = None
    prefill_gemm: str | None = None
    decode_attention: str | None = None
    decode_lora_form: str | None = None
    lora_kernel: bool | None = None
    tune_host_malloc: bool = True
    host_adapter_cache_bytes: int = 2 << 30
    adapter_link_gbps: float | None = None
    cpu_prefill_workers: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", Path(self.model_path))
        if self.dtype not in (*DTYPES, "auto"):
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_lora_rank", "kv_cache_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {list(MEMORY_MODES)}, got {self.memory_mode!r}")
        if self.fair_share_reserved_seqs < 0:
            raise ValueError(f"fair_share_reserved_seqs must be >= 0, got {self.fair_share_reserved_seqs}")
        if self.lora_stack_cache_size < 0:
            raise ValueError(f"lora_stack_cache_size must be >= 0, got {self.lora_stack_cache_size}")
        if self.adapter_cache_bytes is not None and self.adapter_cache_bytes <= 0:
            raise ValueError(f"adapter_cache_bytes must be positive, got {self.adapter_cache_bytes}")
        if self.adapter_eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"adapter_eviction_policy must be one of {sorted(EVICTION_POLICIES)}, "
                f"got {self.adapter_eviction_policy!r}"
            )
        if self.host_adapter_cache_bytes < 0:
            raise ValueError(f"host_adapter_cache_bytes must be >= 0, got {self.host_adapter_cache_bytes}")
        if self.adapter_link_gbps is not None and not self.adapter_link_gbps > 0:
            raise ValueError(f"adapter_link_gbps must be positive or None, got {self.adapter_link_gbps}")
        if self.cpu_prefill_workers < 0:
            raise ValueError(
                f"cpu_prefill_workers must be >= 0 (0 disables CPU-assisted prefill), got {self.cpu_prefill_workers}"
            )
        for name, forms in KERNEL_FORMS.items():
            value = getattr(self, name)
            if value is not None and value not in forms:
                raise ValueError(f"{name} must be one of {list(forms)} or None (chosen by measurement), got {value!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        for name in ("multiqueue_slo_s", "multiqueue_refresh_s", "multiqueue_max_queues"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def batch_policy_options(self) -> dict[str, Any]:
        """Constructor knobs of the named batch policy (none for fifo and sjf)."""
        if self.batch_policy != "multiqueue":
            return {}
        return {
            "slo_s": self.multiqueue_slo_s,
            "refresh_s": self.multiqueue_refresh_s,
            "max_queues": self.multiqueue_max_queues,
        }

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
