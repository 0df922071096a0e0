"""The model runner's adapter side: validating and packing adapters, placing them in their reserved pages
(views of the KV cache in a unified pool), the host tier of packed host copies, and the asynchronous loads
(host copy prepared off the step loop, then copied host -> device) behind CPU-assisted prefill. Owned by
`ModelRunner` (gpu_workers/engine/model_runner.py) as `runner.transfers`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from gpu_workers.engine.adapter_copier import AdapterCopier, CopyJob, pin_host_copy
from gpu_workers.engine.adapter_layout import (
    adapter_layer_numels,
    layer_numels_for,
    num_pages_for_layout,
    place_adapter,
    vocab_numels,
)
from gpu_workers.engine.adapter_loader import load_lora_adapter, pack_lora_adapter, validate_adapter
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.layers.host_lora import HostLora, LayerSwitch
from gpu_workers.engine.layers.linear import MergedLinear
from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraSegment
from gpu_workers.engine.models.llama import LlamaForCausalLM
from gpu_workers.engine.thread_limits import limit_this_thread
from registry.validation import AdapterInfo, BaseModelSpec, ValidationLimits
from scheduler.core.host_tier import HostTier


class AdapterTransfers:
    """Adapter loading, placement and host -> device copies for one runner.

    `adapters` is the runner's map of device copies that batches use; a copy that lands is added to it.
    `kv_caches` and `page_numel` place adapters in their pages when `is_unified` (adapters share the KV pool).
    """

    def __init__(
        self,
        config: EngineConfig,
        model: LlamaForCausalLM,
        model_spec: BaseModelSpec,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        adapters: dict[str, LoraAdapter],
        *,
        is_unified: bool,
        page_numel: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.model = model
        self.args = model.args
        self.model_spec = model_spec
        self.validation_limits = ValidationLimits(max_rank=config.max_lora_rank)
        self.kv_caches = kv_caches
        self.adapters = adapters
        self.is_unified = is_unified
        self.page_numel = page_numel
        self.device = device
        self.dtype = dtype
        self.copier = AdapterCopier(device, config.adapter_link_gbps)
        self.host_copies: dict[str, LoraAdapter] = {}  # adapters whose copy to the device is in flight
        self.host_tier = HostTier(config.host_adapter_cache_bytes)  # packed host copies kept for later copies
        self._host_tier_copies: dict[str, LoraAdapter] = {}
        self._host_tier_keys: dict[str, str] = {}  # adapter id -> host tier key of its load being prepared
        self._cpu_pool: ThreadPoolExecutor | None = None

    # ---- adapters ----------------------------------------------------------------------------------

    def validate_adapter(self, path: Path) -> AdapterInfo:
        """Check an adapter directory against this base model and the engine's limits."""
        return validate_adapter(path, self.model_spec, self.validation_limits)

    def _output_slices(self) -> dict[str, dict[str, tuple[int, int]]]:
        layer0 = self.model.layers[0]
        return {name: getattr(layer0, name).output_slices for name in PROJECTIONS}

    def _base_layers(self) -> list[dict[str, MergedLinear]]:
        """The model's merged projections per layer (a DoRA adapter's rescale is computed against them)."""
        return [{name: getattr(layer, name) for name in PROJECTIONS} for layer in self.model.layers]

    def load_adapter(self, adapter_id: str, path: Path, info: AdapterInfo) -> LoraAdapter:
        """Pack a validated adapter's weights (not yet visible to batches): on the device in a static split;
        in host memory in a unified pool, where `place_adapter` copies them into the adapter's pages."""
        device = torch.device("cpu") if self.is_unified else self.device
        return load_lora_adapter(
            adapter_id,
            path,
            info,
            self._output_slices(),
            self.args.num_layers,
            self.dtype,
            device,
            self._base_layers(),
        )

    def pack_adapter(
        self,
        adapter_id: str,
        per_layer: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
        rank: int,
        scale: float,
    ) -> LoraAdapter:
        """Pack an adapter from tensors instead of files (per layer: module -> (lora_A [r, in], lora_B [out, r]),
        not validated), on this device, for `LLMEngine.install_adapter`: benchmarks generate random adapters
        on the device (benchmarks/gpu_engine_bench.py)."""
        target_modules = tuple(sorted({m for modules in per_layer for m in modules}))
        return pack_lora_adapter(
            adapter_id, per_layer, rank, scale, target_modules, self._output_slices(), self.dtype, self.device
        )

    def adapter_num_pages(self, info: AdapterInfo) -> int | None:
        """Exact pages an adapter's tensor layout takes in a unified pool; None in a static split (the pool
        cuts its bytes by rank rows)."""
        if not self.is_unified:
            return None
        a = self.args
        in_features = {
            "qkv": a.hidden_size,
            "o": a.num_heads * a.head_dim,
            "gate_up": a.hidden_size,
            "down": a.intermediate_size,
        }
        layer0 = self.model.layers[0]
        has_bias = any(getattr(layer0, name).bias is not None for name in PROJECTIONS)
        dora_rows = (2 if has_bias else 1) if info.use_dora else 0
        numels = layer_numels_for(
            info.rank,
            info.target_modules,
            info.layers,
            a.num_layers,
            in_features,
            self._output_slices(),
            dora_rows,
            self.kv_caches[0][0].element_size(),
            vocab_numels(info.target_modules, info.rank, a.vocab_size, a.hidden_size),
        )
        return num_pages_for_layout(numels, self.page_numel)

    def num_pages_of(self, adapter: LoraAdapter) -> int | None:
        """`adapter_num_pages` of an adapter already loaded (from its tensors)."""
        if not self.is_unified:
            return None
        page_element_size = self.kv_caches[0][0].element_size()
        return num_pages_for_layout(adapter_layer_numels(adapter, page_element_size), self.page_numel)

    def place_adapter(self, adapter: LoraAdapter, page_ids: list[int]) -> LoraAdapter:
        """Put a loaded adapter in its reserved pages: views of the KV cache in a unified pool (its host
        tensors are copied there); unchanged in a static split."""
        if not self.is_unified:
            return adapter
        return place_adapter(adapter, self.kv_caches, page_ids, self.page_numel)

    def start_adapter_copy(self, adapter_id: str, path: Path, page_ids: list[int] | None = None) -> None:
        """Start loading an adapter off the step loop: its host copy comes from the host tier, or is read,
        validated and packed (pinned on CUDA) on the copier's preparer thread; then it is copied to the
        device: into its reserved `page_ids` of the KV cache in a unified pool, as tensors of its own in a
        static split. Never reads the files here: invalid or vanished files fail the preparation, reported by
        `take_prepared_copies`."""
        key = _host_tier_key(adapter_id, path)
        pages = list(page_ids or [])
        place = (lambda adapter: self.place_adapter(adapter, pages)) if self.is_unified else None
        self._host_tier_keys[adapter_id] = key
        if self.host_tier.lookup(key):
            self.copier.start(adapter_id, host_copy=self._host_tier_copies[key], place=place)
        else:
            self.copier.start(
                adapter_id, prepare=lambda: self.prepare_host_copy(adapter_id, path), place=place
            )

    def prepare_host_copy(self, adapter_id: str, path: Path) -> LoraAdapter:
        """Read, validate and pack an adapter's files into a host copy (pinned on CUDA); the host tier is
        neither read nor filled. Raises AdapterLoadError when its files are invalid. Thread-safe (the
        copier's preparer thread calls it)."""
        info = self.validate_adapter(path)
        host_copy = load_lora_adapter(
            adapter_id,
            path,
            info,
            self._output_slices(),
            self.args.num_layers,
            self.dtype,
            torch.device("cpu"),
            self._base_layers(),
        )
        return pin_host_copy(host_copy) if self.device.type == "cuda" else host_copy

    def take_prepared_copies(self) -> list[CopyJob]:
        """Loads whose host copy was made (now in `host_copies`, and kept in the host tier when it fits its
        byte budget) or could not be made (`error`) since the last call."""
        prepared = self.copier.take_prepared()
        for job in prepared:
            key = self._host_tier_keys.pop(job.adapter_id, None)
            if job.host_copy is None:
                continue
            self.host_copies[job.adapter_id] = job.host_copy
            if key is not None and not job.is_from_host_tier:
                self._keep_in_host_tier(key, job.host_copy)
        return prepared

    def _keep_in_host_tier(self, key: str, host_copy: LoraAdapter) -> None:
        victims = self.host_tier.add(key, host_copy.num_bytes)
        if victims is not None:
            for victim in victims:
                self._host_tier_copies.pop(victim, None)
            self._host_tier_copies[key] = host_copy

    def forget_host_copies(self, adapter_id: str) -> None:
        """Drop an adapter's host-tier entries (it was unloaded or replaced)."""
        for key in [k for k in self._host_tier_copies if k.split("\0", 1)[0] == adapter_id]:
            self.host_tier.remove(key)
            del self._host_tier_copies[key]

    def cancel_adapter_copy(self, adapter_id: str) -> None:
        """Drop an unfinished load (preparing or copying) and its host copy."""
        self.copier.cancel(adapter_id)
        self.host_copies.pop(adapter_id, None)
        self._host_tier_keys.pop(adapter_id, None)

    def take_finished_copies(self) -> list[CopyJob]:
        """Copies that landed (now in `adapters`) or failed since the last call; their host copies go."""
        finished = self.copier.take_finished()
        for job in finished:
            self.host_copies.pop(job.adapter_id, None)
            if job.device_copy is not None:
                self.adapters[job.adapter_id] = job.device_copy
        return finished

    def host_lora(
        self, segments: list[LoraSegment], host_assisted: frozenset[str], switch_layer: int | None
    ) -> HostLora:
        """The host-assisted part of a step: `segments` over host copies, computed on the CPU pool until each
        adapter's device copy lands (see layers/host_lora.LayerSwitch for `switch_layer`)."""
        switch = LayerSwitch(self._find_device_copy, host_assisted, switch_layer)
        return HostLora(tuple(segments), switch, self._cpu_workers())

    def _find_device_copy(self, adapter_id: str, wait: bool) -> LoraAdapter | None:
        return self.copier.landed(adapter_id, wait)

    def _cpu_workers(self) -> ThreadPoolExecutor:
        if self._cpu_pool is None:
            num_workers = max(self.config.cpu_prefill_workers, 1)
            self._cpu_pool = ThreadPoolExecutor(
                num_workers, thread_name_prefix="cpu-prefill", initializer=limit_this_thread, initargs=(1,)
            )
        return self._cpu_pool


def _host_tier_key(adapter_id: str, path: Path) -> str:
    """The host tier's key of an adapter's files (another version or other files never reuse an entry)."""
    return f"{adapter_id}\0{path}"
