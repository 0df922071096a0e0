"""The engine section: every knob of the native engine an operator sets (LORAHOST_ENGINE_*), one class per concern.

EngineSettings composes five concern classes, as vLLM composes its config from one class per concern: memory
(device and host budgets, the page pool's layout, prefix caching), batching (the step's limits and the admission
order), LoRA (adapter ranks, eviction, copies), kernels (dtype, device, threads and the forced CPU kernel forms)
and vLLM (the backend choice and vLLM's own LoRA knobs). Each concern class declares its fields, checks them and
derives its policies; EngineSettings inherits them all, so a field keeps one flat name (`engine.max_num_seqs`,
LORAHOST_ENGINE_MAX_NUM_SEQS, `Settings(engine_max_num_seqs=...)`): sections nest one level (settings/env.py),
and the engine reads its EngineConfig, a subclass, flat.

gpu_workers.engine.config.EngineConfig is this model plus what the worker adds (the model path, the rank limit, and
knobs only code sets); its docstring explains the memory layout and the policies. Validation errors name the
field and the environment variable to change.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from scheduler.admission.admission import BatchPolicy
from scheduler.admission.batch_policy import BATCH_POLICIES, make_admission_policy
from scheduler.cache.eviction import (
    DEFAULT_EVICTION_POLICY,
    EVICTION_POLICIES,
    EvictionPolicy,
    make_eviction_policy,
)
from scheduler.core.engine_core import CoreLimits
from scheduler.multiqueue.multiqueue import DEFAULT_MAX_QUEUES, DEFAULT_REFRESH_S, DEFAULT_SLO_S
from scheduler.multiqueue.queue_sizing import SIZINGS
from settings.engine_kernels import EngineKernelSettings
from settings.engine_section import EngineSection

ENGINE_BACKENDS = ("native", "vllm")  # gpu_workers/worker/builder.py BACKENDS has one factory for each
MEMORY_MODES = ("unified", "static")


class EngineMemorySettings(EngineSection):
    """Memory: the KV and adapter budgets on the device, the page pool's layout, the host tier, prefix caching."""

    kv_cache_bytes: int = Field(
        default=1 << 30, description="KV cache budget (bytes); in a unified pool KV and adapters share it"
    )
    num_kv_blocks: int | None = Field(default=None, description="KV blocks; overrides the byte budget")
    adapter_cache_bytes: int | None = Field(
        default=None,
        description="Device bytes for adapters in the page pool, on top of the KV cache (the only limit on how "
        "many adapters are on the device; requests wait for room). unified: added to the shared pool (default "
        "0); static: the fixed adapter share (default: room for 64 adapters of max_rank)",
    )
    memory_mode: str = Field(
        default="unified",
        description="Device memory layout: unified = KV blocks and adapter weights share every page of one "
        "budget (adapters stored in the KV cache's pages); static = fixed adapter share beside the KV cache "
        "(the vLLM-style baseline)",
    )
    host_adapter_cache_bytes: int = Field(
        default=2 << 30,
        description="Host memory for packed adapter copies (the tier between the device and the disk cache; "
        "a copy to the device from it skips reading and validating files); 0: off",
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="Reuse the KV of prompt prefixes shared by requests of the same adapter version",
    )
    max_compaction_pages: int = Field(
        default=512,
        description="unified: the most KV pages one adapter load may move out of the way when free pages exist "
        "but no contiguous run of them (the engine copies each moved page's K and V before the step, "
        "scheduler/core/page_compaction.py); bounds the copy one load adds to a step (512 pages of an 8B "
        "model's 2 MiB are ~1 ms of H100 bandwidth); 0: no compaction (a load waits for a run)",
    )

    @field_validator("memory_mode")
    @classmethod
    def _check_memory_mode(cls, value: str, info: ValidationInfo) -> str:
        return cls._choice(value, MEMORY_MODES, info)

    @field_validator("kv_cache_bytes", "num_kv_blocks", "adapter_cache_bytes")
    @classmethod
    def _check_positive_memory(cls, value: int | None, info: ValidationInfo) -> float | None:
        return cls._positive(value, info)

    @field_validator("host_adapter_cache_bytes", "max_compaction_pages")
    @classmethod
    def _check_not_negative_memory(cls, value: int, info: ValidationInfo) -> int:
        return cls._not_negative(value, info)


class EngineBatchingSettings(EngineSection):
    """Batching: the step's and the batch's limits and the order in which waiting requests are admitted."""

    max_num_seqs: int = Field(default=64, description="Max requests running in one batch")
    max_num_batched_tokens: int = Field(default=4096, description="Per-step token budget")
    max_running_tokens: int | None = Field(
        default=None,
        description="Bound on the running batch: a request is admitted only while the running sequences' "
        "tokens (prompt and output so far) plus its prompt stay within it, so requests wait where the batch "
        "policy orders them when compute, not memory, is the bottleneck (scheduler/admission/running_budget.py); "
        "default: no bound (admission stops only for slots, the step's token budget or KV pages)",
    )
    max_running_adapter_mib: int | None = Field(
        default=None,
        description="Bound on the running batch's distinct adapters, in MiB of their weights: a request whose "
        "adapter is not running yet joins only while the running adapters' weights plus its adapter's stay "
        "within it, so that tenants already streaming keep their inter-token time while other tenants' large "
        "cold adapters arrive (a decode step reads every running adapter's weights beside the base model's: "
        "the base model's own weight size keeps a memory-bound step within ~2x a base step); the newcomer waits "
        "its turn (scheduler/admission/running_budget.py); default: no bound",
    )
    max_model_len: int | None = Field(default=None, description="Default: the model's context length")
    num_scheduler_steps: int = Field(
        default=1,
        description="Multi-step scheduling (vLLM's num_scheduler_steps): one plan of decodes runs for up to this "
        "many engine steps while no request waits, no adapter load is under way and no sequence can finish by "
        "length, so the scheduler plans once per window (scheduler/core/multi_step.py); anything that could "
        "change the batch (an arrival, a finish, a copy landing) ends the window before the next step, so "
        "tokens and times are those of 1 (a plan per step); the digital twin always runs windows "
        "(TWIN_SCHEDULER_STEPS, twin/worker_sim.py)",
    )
    batch_policy: str = Field(
        default="fifo",
        description="Admission order of waiting requests, one of "
        f"{sorted(BATCH_POLICIES)} (scheduler/admission/batch_policy.py: fifo = arrival order with head-of-line blocking; "
        "sjf = fewest predicted output tokens first; multiqueue = Chameleon's size-class queues with token "
        "quotas, scheduler/multiqueue/multiqueue.py)",
    )
    fair_share: bool = Field(
        default=True,
        description="Fair share of each engine between tenants (scheduler/admission/fair_share.py, the Virtual Token "
        "Counter of Sheng et al., OSDI'24): the least-served tenant's waiting request is admitted first, in "
        "the batch policy's order within a tenant; false admits in the batch policy's order alone. No effect "
        "while one tenant sends requests.",
    )
    fair_share_reserved_seqs: int = Field(
        default=1,
        description="With fair share: batch slots a tenant that already has a request running may not take, "
        "kept for a tenant with nothing running, so a newly arriving tenant is admitted at the next step "
        "instead of waiting for a flooding tenant's request to finish (costs at most this many of "
        "engine_max_num_seqs slots while one tenant alone fills the batch; requests without a tenant are "
        "never held back); 0 = off",
    )
    multiqueue_slo_s: float = Field(
        default=DEFAULT_SLO_S,
        description="multiqueue: the TTFT SLO (seconds) its M/M/1 rule sizes each queue's minimum token quota for",
    )
    multiqueue_refresh_s: float = Field(
        default=DEFAULT_REFRESH_S,
        description="multiqueue: seconds between recomputing its size classes (K-means) and quotas",
    )
    multiqueue_max_queues: int = Field(
        default=DEFAULT_MAX_QUEUES,
        le=16,
        description="multiqueue: the most size classes (Kmax); its K selection may choose fewer",
    )
    multiqueue_sizing: str = Field(
        default="tokens",
        description=f"multiqueue: how requests are sized, one of {list(SIZINGS)} "
        "(scheduler/multiqueue/queue_sizing.py): wrs = Chameleon's weighted request size (tokens times adapter "
        "size; M/M/1 quotas; the paper's); tokens = the platform's (classes by prompt + predicted output "
        "tokens, each adapter held by admitted requests charged once in a unified pool, quotas by measured "
        "demand; the default: it beat wrs at P99, P50 and goodput in every case measured, benchmarks/RESULTS.md)",
    )
    multiqueue_max_wait_s: float | None = Field(
        default=None,
        description="multiqueue: the age bound (seconds waiting) past which a request is admitted ahead of every "
        "queue's quota and holds back later admissions until it fits (the starvation bound that holds the P99 "
        "TTFT); default: multiqueue_slo_s / 5 with the tokens sizing, none with wrs (Chameleon's rule)",
    )

    @field_validator("multiqueue_sizing")
    @classmethod
    def _check_multiqueue_sizing(cls, value: str, info: ValidationInfo) -> str:
        return cls._choice(value, SIZINGS, info)

    @field_validator("batch_policy")
    @classmethod
    def _check_batch_policy(cls, value: str, info: ValidationInfo) -> str:
        return cls._choice(value, tuple(BATCH_POLICIES), info)

    @field_validator(
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_running_tokens",
        "num_scheduler_steps",
        "max_running_adapter_mib",
        "multiqueue_slo_s",
        "multiqueue_refresh_s",
        "multiqueue_max_queues",
        "multiqueue_max_wait_s",
    )
    @classmethod
    def _check_positive_batching(cls, value: float | None, info: ValidationInfo) -> float | None:
        return cls._positive(value, info)

    @field_validator("fair_share_reserved_seqs")
    @classmethod
    def _check_not_negative_batching(cls, value: int, info: ValidationInfo) -> int:
        return cls._not_negative(value, info)

    def admission_policy(self) -> BatchPolicy:
        """The engine's admission policy: `batch_policy` with its options, inside the tenants' fair share when
        `fair_share` (scheduler/admission/batch_policy.py make_admission_policy)."""
        return make_admission_policy(
            self.batch_policy,
            self.batch_policy_options(),
            is_fair_share=self.fair_share,
            num_reserved_seqs=self.fair_share_reserved_seqs,
            max_num_seqs=self.max_num_seqs,
        )

    def batch_policy_options(self) -> dict[str, Any]:
        """Constructor knobs of the named batch policy (none for fifo and sjf)."""
        if self.batch_policy != "multiqueue":
            return {}
        return {
            "slo_s": self.multiqueue_slo_s,
            "refresh_s": self.multiqueue_refresh_s,
            "max_queues": self.multiqueue_max_queues,
            "sizing": self.multiqueue_sizing,
            "max_wait_s": self.multiqueue_max_wait_s,
        }


class EngineLoraSettings(EngineSection):
    """LoRA: the largest rank served, which idle adapter leaves the device, and how adapters are copied there."""

    max_lora_rank: int | None = Field(
        default=None,
        ge=1,
        description="Largest adapter rank this worker serves (vLLM's max_lora_rank; vLLM sizes its LoRA slots by "
        "it); the router refuses an adapter above every live worker's limit with a 400 naming it; default: "
        "the upload limit (LORAHOST_MAX_RANK)",
    )
    adapter_eviction_policy: str = Field(
        default=DEFAULT_EVICTION_POLICY,
        validation_alias="adapter_eviction_policy",
        description="Worker: which idle device adapter is evicted first when a step needs pages, one of "
        f"{sorted(EVICTION_POLICIES)} (scheduler/cache/eviction.py: least recently used; Chameleon's "
        "frequency/recency/size score; FastLibra's reload cost x reuse probability x recency decay)",
    )
    is_caching_idle_adapters: bool = Field(
        default=True,
        validation_alias="engine_adapter_cache",
        description="Keep adapters no request uses on the device while memory is free (the adapter cache); "
        "false evicts an adapter as soon as no running or waiting request uses it (the S-LoRA / no-cache "
        "baseline: every later request for it copies it again, and prefetch hints last one step)",
    )
    adapter_link_gbps: float | None = Field(
        default=None,
        description="Emulated host->device adapter link bandwidth in GB/s (a copy of n bytes takes at least "
        "n / bandwidth seconds); default: no emulation",
    )
    cpu_prefill_workers: int = Field(
        default=2,
        description="CPU threads computing the LoRA delta of prefills whose adapter is still being copied "
        "(CPU-assisted prefill); 0: such requests wait for the copy",
    )

    @field_validator("adapter_eviction_policy")
    @classmethod
    def _check_adapter_eviction_policy(cls, value: str, info: ValidationInfo) -> str:
        return cls._choice(value, tuple(EVICTION_POLICIES), info)

    @field_validator("adapter_link_gbps")
    @classmethod
    def _check_positive_lora(cls, value: float | None, info: ValidationInfo) -> float | None:
        return cls._positive(value, info)

    @field_validator("cpu_prefill_workers")
    @classmethod
    def _check_not_negative_lora(cls, value: int, info: ValidationInfo) -> int:
        return cls._not_negative(value, info)

    def eviction_policy(self) -> EvictionPolicy:
        """The order in which idle adapters leave the device (scheduler/cache/eviction.py)."""
        return make_eviction_policy(self.adapter_eviction_policy)


class EngineVllmSettings(EngineSection):
    """vLLM: which engine runs behind the worker, and the knobs only the vLLM backend reads."""

    backend: str | None = Field(
        default=None,
        description="The engine behind the worker: native or vllm (`lorahost worker --engine`); default: "
        "worker_backend, itself native",
    )
    max_loras: int = Field(
        default=8,
        description="vLLM backend: distinct adapters in one batch (vLLM's max_loras; the worker holds requests "
        "beyond it in the batch policy's order)",
    )
    max_cpu_loras: int = Field(
        default=32, description="vLLM backend: adapters vLLM keeps in its host cache (vLLM's max_cpu_loras)"
    )

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else cls._choice(value, ENGINE_BACKENDS, info)

    @field_validator("max_loras", "max_cpu_loras")
    @classmethod
    def _check_positive_vllm(cls, value: int, info: ValidationInfo) -> float | None:
        return cls._positive(value, info)


class EngineSettings(
    EngineVllmSettings, EngineKernelSettings, EngineLoraSettings, EngineBatchingSettings, EngineMemorySettings
):
    """The native engine's operator knobs (section `engine`; flat names engine_*): every concern's fields, flat
    (bases listed last concern first, so the fields read memory, batching, LoRA, kernels, vLLM)."""

    def core_limits(self) -> CoreLimits:
        """The engine core's scheduling limits and switches (scheduler/core/engine_core.py)."""
        return CoreLimits(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            num_cpu_prefill_workers=self.cpu_prefill_workers,
            is_caching_idle_adapters=self.is_caching_idle_adapters,
            max_compaction_pages=self.max_compaction_pages,
            max_running_tokens=self.max_running_tokens,
            num_scheduler_steps=self.num_scheduler_steps,
            max_running_adapter_bytes=(
                None if self.max_running_adapter_mib is None else self.max_running_adapter_mib * 2**20
            ),
        )
