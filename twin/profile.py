"""The twin's profile file: one hardware + model pair's step-cost coefficients, copy link and memory, each
constant with its source.

One shape (`TwinProfile`, pydantic, frozen, unknown keys refused), stored as JSON or YAML (`.yaml`/`.yml`,
with PyYAML). `load_profile` raises `ProfileError` naming the file and the field to fix. Times are in
microseconds (`*_us`), sizes in bytes, bandwidth in GB/s (1e9 bytes per second). The formula that uses the
coefficients is twin/cost_model.py's. `sources` maps a constant's dotted name
(`step.per_prefill_token_us`, `copy.host_to_device_gbps`, `memory.device_bytes`, `model.num_layers`, ...) to
where its number comes from (URL or paper, and which number); `notes` say where sources disagree.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from scheduler.core.step_cost import LoraForm
from settings.api import DEFAULT_MAX_LORA_RANK
from twin.model_file import YAML_SUFFIXES, read_file_content, validate_file_content, yaml_module

PROFILE_VERSION = 1


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and what to fix."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProfileModel(_Frozen):
    """The served model's shape (Hugging Face config.json names in comments) as a profile file holds it; its
    memory arithmetic is the engine's own (`shape`: scheduler/core/memory_geometry.py ModelShape)."""

    name: str
    num_layers: int = Field(gt=0)  # num_hidden_layers
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)  # num_attention_heads
    num_kv_heads: int = Field(gt=0)  # num_key_value_heads
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    dtype_bytes: int = Field(gt=0)  # 2 for float16/bfloat16, 4 for float32
    max_position_embeddings: int = Field(default=4096, gt=0)

    @property
    def shape(self) -> ModelShape:
        """The engine core's model shape."""
        return ModelShape(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers."""
        return self.shape.kv_bytes_per_token(self.dtype_bytes)

    @property
    def adapter_bytes_per_rank(self) -> int:
        """Bytes of one rank row of an adapter targeting every projection (q, k, v, o, gate, up, down)."""
        return self.shape.adapter_row_bytes(self.dtype_bytes)

    def adapter_bytes(self, rank: int) -> int:
        """Bytes of a rank-`rank` adapter on every projection."""
        return rank * self.adapter_bytes_per_rank

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str, dtype_bytes: int) -> ProfileModel:
        """The model section from a Hugging Face config.json's content (the engine's parsing)."""
        shape = ModelShape.from_hf_config(config)
        return cls(name=name, dtype_bytes=dtype_bytes, **dataclasses.asdict(shape))


class Hardware(_Frozen):
    """Where the profile was measured (or what it describes)."""

    name: str  # e.g. "NVIDIA H100 80GB SXM, vLLM 0.8.4"
    device: str  # "cuda", "cpu"
    engine: str = ""  # the serving engine the numbers come from


class StepCost(_Frozen):
    """Coefficients of one engine step's time (twin/cost_model.py), microseconds; all >= 0.

    fixed_us: per step that runs anything (launches, sampling, sync); min_dense_us: floor of the token-linear
    work (the weights are read once whatever the batch); per_prefill_attention_us: per unit of
    StepShape.prefill_attention_tokens; per_decode_context_token_us: per KV token a decode row reads;
    lora_form: "sum" (sum of tokens x rank, segmented kernels) or "max" (tokens x largest rank, padded
    kernels); lora_per_adapter_us / lora_per_adapter_rank_us: per distinct device adapter / per rank of each
    (its weights read); lora_step_us: once per step with any device LoRA work; lora_multiplier_*: the device
    time is multiplied by base + per_adapter x A when the step has A > 0 device adapters;
    host_prefill_per_token_rank_us: a CPU worker's LoRA delta (CPU-assisted prefill), per token x rank;
    host_prefill_step_us: once per step with host-assisted entries (handing rows to the workers and back);
    is_host_prefill_overlapped: True when the host work runs beside the device's (the step takes the longer
    of the two, CaraServe's form), False when the device waits for it (they add: lorahost's engine, which
    waits for each projection's host delta); scheduler_us: the scheduler's own time per step.
    """

    fixed_us: float = Field(ge=0)
    min_dense_us: float = Field(default=0.0, ge=0)
    per_prefill_token_us: float = Field(ge=0)
    per_prefill_attention_us: float = Field(default=0.0, ge=0)
    per_decode_seq_us: float = Field(ge=0)
    per_decode_context_token_us: float = Field(default=0.0, ge=0)
    lora_form: LoraForm = "sum"
    lora_per_token_rank_us: float = Field(default=0.0, ge=0)
    lora_per_adapter_us: float = Field(default=0.0, ge=0)
    lora_per_adapter_rank_us: float = Field(default=0.0, ge=0)
    lora_step_us: float = Field(default=0.0, ge=0)
    lora_multiplier_base: float = Field(default=1.0, ge=0)
    lora_multiplier_per_adapter: float = Field(default=0.0, ge=0)
    host_prefill_per_token_rank_us: float = Field(default=0.0, ge=0)
    host_prefill_step_us: float = Field(default=0.0, ge=0)
    is_host_prefill_overlapped: bool = True
    scheduler_us: float = Field(default=0.0, ge=0)


class CopyCost(_Frozen):
    """The host -> device link adapters are copied over, and the host work before a copy.

    `prepare_*`: reading, validating and packing an adapter's host copy before its copy starts, on the
    engine's preparer thread (off the step loop: the adapter's requests wait for it, the others keep
    stepping; a host-tier hit skips it). None: host copies are ready when a copy starts, as in the published
    GPU profiles. `prepare_step_factor`: a step that runs while a preparation does costs this many times its
    price (a CPU engine's preparer shares the step's cores; 1.0 on a GPU, where the forward does not)."""

    host_to_device_gbps: float = Field(gt=0)
    per_copy_us: float = Field(default=0.0, ge=0)
    prepare_gbps: float | None = Field(default=None, gt=0)
    prepare_us: float = Field(default=0.0, ge=0)
    prepare_step_factor: float = Field(default=1.0, ge=1.0)


class Memory(_Frozen):
    """Device memory for KV blocks and adapters (what remains after weights and activations)."""

    device_bytes: int = Field(gt=0)
    block_size: int = Field(default=16, gt=0)  # tokens per KV block
    kv_bytes_per_token: int | None = Field(default=None, gt=0)  # None: from the model shape


class TwinProfile(_Frozen):
    """A profile file's content (module doc)."""

    version: int = PROFILE_VERSION
    hardware: Hardware
    model: ProfileModel
    step: StepCost
    copy_link: CopyCost = Field(alias="copy")
    memory: Memory
    sources: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _check(self) -> TwinProfile:
        if self.version != PROFILE_VERSION:
            raise ValueError(f"version {self.version} is not supported (this build reads {PROFILE_VERSION})")
        unknown = sorted(set(self.sources) - set(constant_names()))
        if unknown:
            raise ValueError(
                f"sources name unknown constants {unknown}; use dotted names like 'step.fixed_us'"
            )
        return self

    @property
    def kv_bytes_per_token(self) -> int:
        """memory.kv_bytes_per_token, else the model shape's."""
        return self.memory.kv_bytes_per_token or self.model.kv_bytes_per_token

    @property
    def num_kv_tokens(self) -> int:
        """Tokens of KV the device memory holds when no adapter takes any of it."""
        return self.memory.device_bytes // self.kv_bytes_per_token

    def geometry(
        self,
        memory_mode: str,
        *,
        adapter_cache_bytes: int | None = None,
        max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
        max_model_len: int | None = None,
    ) -> MemoryGeometry:
        """The device's paging under this profile: `memory.device_bytes` is the whole budget; a static split
        takes `adapter_cache_bytes` (else room for the default number of max-rank adapters) out of it for
        adapters, a unified pool shares all of it."""
        page_bytes = self.kv_bytes_per_token * self.memory.block_size
        shape = self.model.shape
        adapter_share = 0
        if memory_mode == "static":
            adapter_share = MemoryGeometry.plan(
                shape, element_size=self.model.dtype_bytes, block_size=self.memory.block_size,
                memory_mode="static", kv_cache_bytes=page_bytes, adapter_cache_bytes=adapter_cache_bytes,
                max_lora_rank=max_lora_rank,
            ).num_adapter_pages * page_bytes  # fmt: skip
        num_kv_blocks = (self.memory.device_bytes - adapter_share) // page_bytes
        if num_kv_blocks < 1:
            raise ValueError(
                f"the adapter share ({adapter_share} bytes) leaves no KV block of the profile's "
                f"{self.memory.device_bytes} device bytes; lower adapter_cache_bytes or max_lora_rank"
            )
        return MemoryGeometry.plan(
            shape,
            element_size=self.model.dtype_bytes,
            block_size=self.memory.block_size,
            memory_mode=memory_mode,
            kv_cache_bytes=0,
            num_kv_blocks=int(num_kv_blocks),
            adapter_cache_bytes=adapter_share if memory_mode == "static" else None,
            max_lora_rank=max_lora_rank,
            max_model_len=max_model_len,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able content (the file's keys)."""
        return self.model_dump(mode="json", by_alias=True)

    def missing_sources(self) -> list[str]:
        """Constants this profile sets (required, or away from their default) with no source, neither their own
        nor their section's (a `sources` key may be a section name: "model" covers every model.* constant)."""
        missing = []
        for section, attr in _SECTION_ATTRS.items():
            part: BaseModel = getattr(self, attr)
            for name, info in type(part).model_fields.items():
                is_set = info.is_required() or getattr(part, name) != info.default
                if is_set and f"{section}.{name}" not in self.sources and section not in self.sources:
                    missing.append(f"{section}.{name}")
        return missing


_SECTION_ATTRS = {"model": "model", "step": "step", "copy": "copy_link", "memory": "memory"}
_SECTIONS: dict[str, type[BaseModel]] = {
    "model": ProfileModel,
    "step": StepCost,
    "copy": CopyCost,
    "memory": Memory,
}


def constant_names() -> list[str]:
    """Every name a profile's `sources` may use: a section ("model", "step", "copy", "memory") or one of its
    constants ("step.fixed_us")."""
    return list(_SECTIONS) + [
        f"{section}.{name}" for section, cls in _SECTIONS.items() for name in cls.model_fields
    ]


def profile_from_dict(data: Any, origin: str = "<profile>") -> TwinProfile:
    """Validate a profile's content; ProfileError naming `origin` and each field to fix."""
    return validate_file_content(TwinProfile, data, origin, "twin profile", ProfileError)


def load_profile(path: Path | str) -> TwinProfile:
    """Read and validate a profile file (JSON, or YAML by suffix); ProfileError saying what to fix."""
    path = Path(path)
    return profile_from_dict(read_file_content(path, "profile", ProfileError), str(path))


def save_profile(profile: TwinProfile, path: Path | str) -> None:
    """Write a profile (YAML by suffix, else JSON), creating parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.to_dict()
    if path.suffix in YAML_SUFFIXES:
        path.write_text(_yaml_dump(data))
    else:
        path.write_text(json.dumps(data, indent=1) + "\n")


def _yaml_dump(data: dict[str, Any]) -> str:
    return str(yaml_module(ProfileError).safe_dump(data, sort_keys=False))
