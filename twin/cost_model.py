"""`CostModel`: how long one engine step and one adapter copy take, from a `TwinProfile`.

With the profile's step coefficients (microseconds; twin/profile.py `StepCost`) and a `StepShape`:

    dense   = max(min_dense, per_prefill_token * P + per_decode_seq * D)
    attn    = per_prefill_attention * prefill_attention_tokens + per_decode_context_token * decode_context_tokens
    lora    = lora_per_token_rank * W + lora_per_adapter * A + lora_per_adapter_rank * sum(adapter ranks)
              + lora_step * [A > 0]
              W = sum_i tokens_i * rank_i ("sum": segmented kernels, S-LoRA MBGMV / Punica SGMV)
                  or (sum_i tokens_i) * max_i rank_i ("max": kernels padded to the largest rank, BGMV)
    device  = (fixed + dense + attn + lora) * m,   m = lora_multiplier_base + lora_multiplier_per_adapter * A
                                                   when A > 0, else 1 (the Agullo et al. multiplicative form)
    host    = host_prefill_step + host_prefill_per_token_rank * max_j tokens_j * rank_j   over host-assisted
              entries (one CPU worker each, in parallel; 0 without such entries)
    step    = scheduler + max(device, host)    is_host_prefill_overlapped (CaraServe's form: the host works
                                               beside the device)
            = scheduler + device + host        otherwise (lorahost's engine: the device waits for each
                                               projection's host delta)          (0 for an empty step)

The host part lasts until the host-assisted adapters' copies land at the latest (`max_host_seconds`: the
engine switches to the device copy between layers). Overlapped, it is cut there; added, the layers before
the landing pay device + host per layer and those after the device's part only: a step that would take
T = device + host and switches at L < T takes L + device * (1 - L / T).

P: prefill tokens, D: decode rows, A: distinct adapters whose delta runs on the device. Prefill is priced
explicitly (tokens and quadratic attention), unlike the digital-twin paper's model, which charges only per
sequence and so misses TTFT. A copy of `n` bytes takes per_copy + n / host_to_device bandwidth; preparing its
host copy first (when the profile has `copy.prepare_gbps`) takes prepare + n / prepare bandwidth of the
engine's preparer thread, off the step loop (twin/simulated_executor.py: the adapter's requests wait for
it, the steps of the others do not, but cost `copy.prepare_step_factor` times their price meanwhile: on a CPU
engine the preparer shares the step's cores).

KV pages moved out of an adapter's run (scheduler/core/page_compaction.py) are copied on the device before
the step: n bytes moved take 2n / device bandwidth (read and write), the bandwidth the profile's per-adapter
read term implies (adapter_bytes_per_rank / lora_per_adapter_rank_us: the H100 profiles' 50% of 3.35 TB/s);
free when the profile has no such term.

The token terms (per_prefill_token x P + per_decode_seq x D) and the LoRA work term (lora_per_token_rank x W)
are the step-cost terms shared with the router's performance model (scheduler/core/step_cost.py).
"""

from __future__ import annotations

from scheduler.core.step_cost import StepCostTerms, lora_work
from twin.profile import TwinProfile
from twin.step_shape import StepShape

__all__ = [
    "CostModel",
    "lora_work",
]  # lora_work: re-exported (its one definition is scheduler.core.step_cost)

_US = 1e-6


class CostModel:
    """Step and copy times (seconds) of one profile (module doc)."""

    def __init__(self, profile: TwinProfile) -> None:
        self.profile = profile
        self.step_cost = profile.step
        self.terms = StepCostTerms(
            per_token=profile.step.per_prefill_token_us,
            per_seq=profile.step.per_decode_seq_us,
            per_token_rank=profile.step.lora_per_token_rank_us,
            lora_form=profile.step.lora_form,
        )
        self._bytes_per_second = profile.copy_link.host_to_device_gbps * 1e9
        self._per_copy_s = profile.copy_link.per_copy_us * _US
        prepare_gbps = profile.copy_link.prepare_gbps
        self._prepare_bytes_per_second = None if prepare_gbps is None else prepare_gbps * 1e9
        self._per_prepare_s = profile.copy_link.prepare_us * _US
        self.prepare_step_factor = profile.copy_link.prepare_step_factor

    def step_seconds(self, shape: StepShape, max_host_seconds: float | None = None) -> float:
        """Simulated wall time of one step of `shape`; 0 when it computes nothing. `max_host_seconds`: when
        the host-assisted adapters' copies land (the engine switches to the device copy between layers, so
        the host's part ends there at the latest; None: it runs to the end)."""
        if shape.is_empty:
            return 0.0
        device = self.device_seconds(shape)
        host = self.host_prefill_seconds(shape)
        landing = None if max_host_seconds is None else max(max_host_seconds, 0.0)
        if self.step_cost.is_host_prefill_overlapped:
            busy = max(device, host if landing is None else min(host, landing))
        else:
            busy = device + host
            if landing is not None and host > 0 and landing < busy:
                busy = landing + device * (1.0 - landing / busy)
        return self.step_cost.scheduler_us * _US + busy

    def device_seconds(self, shape: StepShape) -> float:
        """The device's part of the step (fixed + dense + attention + LoRA, times the adapter multiplier)."""
        c = self.step_cost
        dense = max(c.min_dense_us, self.terms.token_cost(shape.num_prefill_tokens, shape.num_decode_seqs))
        attention = (
            c.per_prefill_attention_us * shape.prefill_attention_tokens
            + c.per_decode_context_token_us * shape.decode_context_tokens
        )
        return (c.fixed_us + dense + attention + self.lora_us(shape)) * self.multiplier(shape) * _US

    def lora_us(self, shape: StepShape) -> float:
        """The additive LoRA term of the step, microseconds."""
        c = self.step_cost
        if not shape.adapter_ranks:
            return 0.0
        return (
            self.terms.lora_cost(shape.lora_token_ranks)
            + c.lora_per_adapter_us * shape.num_distinct_adapters
            + c.lora_per_adapter_rank_us * sum(shape.adapter_ranks)
            + c.lora_step_us
        )

    def multiplier(self, shape: StepShape) -> float:
        """The multiplicative LoRA factor of the step's device time (1 without device adapters)."""
        if not shape.adapter_ranks:
            return 1.0
        c = self.step_cost
        return c.lora_multiplier_base + c.lora_multiplier_per_adapter * shape.num_distinct_adapters

    def host_prefill_seconds(self, shape: StepShape) -> float:
        """The host-assisted entries' part: per step, plus the slowest CPU worker's LoRA delta (0 when
        none)."""
        if not shape.host_token_ranks:
            return 0.0
        work = max(tokens * rank for tokens, rank in shape.host_token_ranks)
        c = self.step_cost
        return (c.host_prefill_step_us + c.host_prefill_per_token_rank_us * work) * _US

    def copy_seconds(self, num_bytes: int) -> float:
        """Host -> device copy of `num_bytes` (0 for nothing to copy)."""
        if num_bytes <= 0:
            return 0.0
        return self._per_copy_s + num_bytes / self._bytes_per_second

    def prepare_seconds(self, num_bytes: int) -> float:
        """Host work (on the preparer, off the step loop) before a copy of `num_bytes` (0 when the profile has
        none)."""
        if self._prepare_bytes_per_second is None or num_bytes <= 0:
            return 0.0
        return self._per_prepare_s + num_bytes / self._prepare_bytes_per_second

    def device_copy_seconds(self, num_bytes: int) -> float:
        """Copy of `num_bytes` within device memory (read and write), at the bandwidth the per-adapter read term
        implies (module doc); 0 when the profile has none."""
        per_rank_us = self.step_cost.lora_per_adapter_rank_us
        if num_bytes <= 0 or per_rank_us <= 0:
            return 0.0
        bytes_per_second = self.profile.model.adapter_bytes_per_rank / (per_rank_us * _US)
        return 2 * num_bytes / bytes_per_second

    def adapter_copy_seconds(self, rank: int) -> float:
        """Copy of a rank-`rank` adapter on every projection of the profile's model."""
        return self.copy_seconds(self.profile.model.adapter_bytes(rank))
