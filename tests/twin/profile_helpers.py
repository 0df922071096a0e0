"""A tiny twin profile with round coefficients, for hand-computed tests."""

from __future__ import annotations

from typing import Any

from twin.cost_model import CostModel
from twin.profile import TwinProfile, profile_from_dict


def tiny_profile_dict(**step: Any) -> dict[str, Any]:
    """A valid profile's content; `step` overrides step coefficients."""
    return {
        "version": 1,
        "hardware": {"name": "test", "device": "cpu"},
        "model": {
            "name": "tiny",
            "num_layers": 2,
            "hidden_size": 8,
            "num_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 4,
            "intermediate_size": 16,
            "vocab_size": 32,
            "dtype_bytes": 2,
        },
        "step": {
            "fixed_us": 100.0,
            "per_prefill_token_us": 2.0,
            "per_prefill_attention_us": 0.01,
            "per_decode_seq_us": 5.0,
            "per_decode_context_token_us": 0.1,
            "lora_per_token_rank_us": 0.05,
            "lora_per_adapter_us": 20.0,
            "lora_per_adapter_rank_us": 0.5,
            **step,
        },
        "copy": {"host_to_device_gbps": 2.0, "per_copy_us": 10.0},
        "memory": {"device_bytes": 1_000_000},
        "sources": {"model": "made up for tests", "step.fixed_us": "made up"},
    }


def tiny_profile(**step: Any) -> TwinProfile:
    """tiny_profile_dict, validated."""
    return profile_from_dict(tiny_profile_dict(**step))


def round_cost_model(
    *, prepare_gbps: float | None = None, prepare_step_factor: float = 1.0, **step: Any
) -> CostModel:
    """The timeline tests' profile of round numbers: a step costs 1 ms fixed + 0.1 ms per prefill token + 0.5 ms
    per decode row and nothing else (`step` overrides), a copy 0.5 s per MB (a 2 MB/s link, no latency);
    `prepare_gbps`: the host copy's preparation on the preparer thread (None: none); `prepare_step_factor`: what
    a step beside a preparation costs over its price."""
    data = tiny_profile_dict(
        **{
            "fixed_us": 1000.0,
            "per_prefill_token_us": 100.0,
            "per_prefill_attention_us": 0.0,
            "per_decode_seq_us": 500.0,
            "per_decode_context_token_us": 0.0,
            "lora_per_token_rank_us": 0.0,
            "lora_per_adapter_us": 0.0,
            "lora_per_adapter_rank_us": 0.0,
            **step,
        }
    )
    data["copy"] = {
        "host_to_device_gbps": 0.002,
        "per_copy_us": 0.0,
        "prepare_gbps": prepare_gbps,
        "prepare_step_factor": prepare_step_factor,
    }
    return CostModel(profile_from_dict(data))
