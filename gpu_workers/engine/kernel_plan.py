"""Which implementation runs each op that matters, on this machine and for this model: forced by the engine
config, else measured by the kernel tuner on the model's own shapes (gpu_workers/engine/kernel_tuner.py, cached).

Ops and their candidates (simplest first; each candidate gives the same tokens, see the parity tests):
- linear_weights (layers/linear.py): "plain" / "packed" (the projections' weights oneDNN-packed), where oneDNN
  can pack this dtype; forced by `packed_linears`;
- prefill_gemm (layers/linear.py): "packed" / "fp32_upcast" / "plain", for products of >= WIDE_GEMM_MIN_ROWS
  rows of a packed bf16 model (smaller ones, decode, always run on the packed weight);
- decode_attention (layers/attention.py): "sdpa" / "sdpa_fp32" / "grouped_matmul" / "c_kernel" (CPU) /
  "triton" (CUDA with triton: layers/triton_attention.py);
- prefill_attention (layers/attention.py): "sdpa" / "triton" (CUDA with triton), not measured where sdpa is the
  only usable form (every CPU);
- decode_lora (layers/lora_forms.py): "segmented" / "stacked" / "kernel" (CPU) / "sgmv" / "bgmv" (CUDA, Triton),
  measured on CPU and on CUDA; forms that cannot run here are no candidates, with why in the choice's `skipped`;
- decode_step (layers/pointwise.py, gpu_workers/engine/compiled_decode.py): "eager" / "compiled" (a decoder layer's
  elementwise runs through torch.compile), measured on CPU on one layer's decode step with the plan's linears and
  decode attention, the compile bounded by `compile_budget_s`; eager on CUDA (decode steps are captured there,
  gpu_workers/engine/decode_graphs.py).
On CUDA the measured choices are keyed by the GPU's name, CUDA and triton versions too (kernel_tuner.py times
each call to its end).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gpu_workers.engine.compiled_decode import decode_step_candidates
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.kernel_tuner import KernelTuner, accelerator_fingerprint
from gpu_workers.engine.layers.attention import (
    DECODE_ATTENTION_FORMS,
    DECODE_ATTENTION_OP,
    PREFILL_ATTENTION_FORMS,
    PREFILL_ATTENTION_OP,
    TRITON_FORM,
    is_decode_form_usable,
    is_prefill_form_usable,
    triton_unusable_reason,
)
from gpu_workers.engine.layers.attention_candidates import (
    decode_attention_candidates,
    prefill_attention_candidates,
)
from gpu_workers.engine.layers.linear import (
    LINEAR_WEIGHTS_FORMS,
    LINEAR_WEIGHTS_OP,
    LINEAR_WEIGHTS_TUNING_ROWS,
    PREFILL_GEMM_FORMS,
    PREFILL_GEMM_OP,
    WIDE_GEMM_MIN_ROWS,
    can_pack_linear,
    linear_weights_candidates,
    prefill_gemm_candidates,
)
from gpu_workers.engine.layers.lora_forms import (
    DECODE_LORA_FORMS,
    DECODE_LORA_OP,
    TUNING_RANKS,
    decode_lora_candidates,
    lora_form_unusable_reason,
    projection_slices,
)
from gpu_workers.engine.layers.pointwise import DECODE_STEP_FORMS, DECODE_STEP_OP
from gpu_workers.engine.loader import read_hf_config
from gpu_workers.engine.models.llama import ModelArgs

logger = logging.getLogger(__name__)

# The decode batch the tuner measures on: this many sequences (at most max_num_seqs) of this many tokens, its
# K/V cycling through one page pool per layer up to TUNING_KV_BYTES (beyond the CPU's caches: cold pages).
TUNING_NUM_SEQS = 16
TUNING_CONTEXT_LEN = 256
TUNING_KV_BYTES = 96 << 20
# On a GPU, a decode batch that keeps it busy: (sequences, tokens each).
TUNING_GPU_DECODE = (64, 1024)
# The prefill step the tuner measures attention on (CUDA only): (new tokens, context length) per chunk; whole
# prompts of different lengths and one chunk after cached tokens.
TUNING_PREFILL_CHUNKS = ((512, 512), (256, 256), (128, 128), (37, 37), (256, 1024))


@dataclass(frozen=True)
class KernelPlan:
    """The chosen implementation of each op (one of its forms)."""

    prefill_gemm: str
    decode_attention: str
    decode_lora: str
    linear_weights: str = "plain"
    prefill_attention: str = "sdpa"
    decode_step: str = "eager"

    @property
    def is_packed_linears(self) -> bool:
        """True when the model's projections run on oneDNN-packed weights."""
        return self.linear_weights == "packed"

    @property
    def wide_gemm_dtype(self) -> torch.dtype | None:
        """The dtype prefill-sized products of the packed model run in on a dense weight, or None (packed)."""
        return {"packed": None, "fp32_upcast": torch.float32, "plain": torch.bfloat16}[self.prefill_gemm]

    @property
    def lora_wide_dtype(self) -> torch.dtype | None:
        """float32 when prefill-sized LoRA segments multiply upcasts (as the fp32_upcast GEMMs), else None."""
        return torch.float32 if self.prefill_gemm == "fp32_upcast" else None


def _linear_weights(
    tuner: KernelTuner, config: EngineConfig, args: ModelArgs, dtype: torch.dtype, device: torch.device
) -> str:
    """The projections' weights, "packed" or "plain": forced by config.linear_weights (or the code knob
    packed_linears), else measured on the MLP's shape."""
    forms = LINEAR_WEIGHTS_FORMS if can_pack_linear(dtype, device) else ("plain",)
    forced = config.linear_weights
    if forced is None and config.packed_linears is not None:
        forced = "packed" if config.packed_linears else "plain"
    if forced not in forms:
        forced = None  # packing asked for where oneDNN cannot: plain, the only form
    shape = (*LINEAR_WEIGHTS_TUNING_ROWS, args.hidden_size, args.intermediate_size)
    build = lambda: linear_weights_candidates(forms, args.intermediate_size, args.hidden_size, dtype)
    return tuner.choose(LINEAR_WEIGHTS_OP, forms, build, shape, dtype, forced=forced).choice


def tune_for_config(config: EngineConfig, tuner: KernelTuner) -> KernelPlan:
    """The plan an engine of `config` would run with (`lorahost tune`): the same threads, dtype, device and
    model shapes (config.json only; no weights are read)."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
        tuner.machine = {**tuner.machine, "threads": str(torch.get_num_threads())}
    device, dtype = config.resolved_device(), config.resolved_dtype()
    args = ModelArgs.from_hf_config(read_hf_config(config.model_path))
    return plan_kernels(tuner, config, args, dtype, device)


def plan_kernels(
    tuner: KernelTuner, config: EngineConfig, args: ModelArgs, dtype: torch.dtype, device: torch.device
) -> KernelPlan:
    """Each op's implementation: the config's forced choice, else the tuner's (measured here or cached).
    Ops with a single usable candidate on this device and dtype are not measured."""
    if device.type == "cuda":
        tuner.machine = {**tuner.machine, **accelerator_fingerprint(device)}
        reason = triton_unusable_reason(device, dtype)
        if reason is not None:
            logger.info("triton attention forms are not candidates: %s", reason)
    linear_weights = _linear_weights(tuner, config, args, dtype, device)
    use_packed_linears = linear_weights == "packed"
    prefill_gemm = _prefill_gemm(tuner, config, args, dtype, use_packed_linears)
    decode_attention = _decode_attention(tuner, config, args, dtype, device)
    return KernelPlan(
        prefill_gemm=prefill_gemm,
        decode_attention=decode_attention,
        decode_lora=_decode_lora(tuner, config, args, dtype, device, use_packed_linears),
        linear_weights=linear_weights,
        prefill_attention=_prefill_attention(tuner, config, args, dtype, device),
        decode_step=_decode_step(tuner, config, args, dtype, device, use_packed_linears, decode_attention),
    )


def _usable_forms(
    op: str, forms: tuple[str, ...], forced: str | None, device: torch.device, dtype: torch.dtype
) -> tuple[str, ...]:
    """The attention forms of `op` that can run here; a forced one that cannot is refused, with the reason."""
    is_usable = is_decode_form_usable if op == DECODE_ATTENTION_OP else is_prefill_form_usable
    usable = tuple(f for f in forms if is_usable(f, device, dtype))
    if forced is not None and forced not in usable:
        reason = triton_unusable_reason(device, dtype) if forced == TRITON_FORM else None
        raise ValueError(
            f"{op} {forced!r} cannot run here; usable: {list(usable)}" + (f" ({reason})" if reason else "")
        )
    return usable


def _prefill_gemm(
    tuner: KernelTuner, config: EngineConfig, args: ModelArgs, dtype: torch.dtype, use_packed_linears: bool
) -> str:
    if not use_packed_linears:
        return "plain"  # nothing to choose: the weights are not packed (F.linear on the dense weight)
    if dtype != torch.bfloat16:
        return "packed"  # nothing to choose: no upcast for an fp32 model
    forced = (
        config.prefill_gemm or {True: "fp32_upcast", False: "packed", None: None}[config.fp32_prefill_gemms]
    )
    num_rows = 4 * WIDE_GEMM_MIN_ROWS
    shape = (num_rows, args.hidden_size, args.intermediate_size)
    forms = PREFILL_GEMM_FORMS
    build = lambda: prefill_gemm_candidates(forms, args.intermediate_size, args.hidden_size, dtype, num_rows)
    return tuner.choose(PREFILL_GEMM_OP, forms, build, shape, dtype, forced=forced).choice


def _decode_attention(
    tuner: KernelTuner, config: EngineConfig, args: ModelArgs, dtype: torch.dtype, device: torch.device
) -> str:
    forms = _usable_forms(DECODE_ATTENTION_OP, DECODE_ATTENTION_FORMS, config.decode_attention, device, dtype)
    if device.type == "cpu":
        num_seqs, context_len = min(TUNING_NUM_SEQS, config.max_num_seqs), TUNING_CONTEXT_LEN
    else:
        num_seqs, context_len = min(TUNING_GPU_DECODE[0], config.max_num_seqs), TUNING_GPU_DECODE[1]
    shape = (num_seqs, context_len, args.num_heads, args.num_kv_heads, args.head_dim, config.block_size)

    pool_bytes = 2 * num_seqs * context_len * args.num_kv_heads * args.head_dim * dtype.itemsize
    num_pools = max(1, min(args.num_layers, TUNING_KV_BYTES // pool_bytes))

    def build() -> dict:
        return decode_attention_candidates(
            forms,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            dtype,
            device,
            config.block_size,
            num_seqs,
            context_len,
            num_pools,
        )

    return tuner.choose(
        DECODE_ATTENTION_OP, forms, build, shape, dtype, forced=config.decode_attention
    ).choice


def _prefill_attention(
    tuner: KernelTuner, config: EngineConfig, args: ModelArgs, dtype: torch.dtype, device: torch.device
) -> str:
    forced = config.prefill_attention
    forms = _usable_forms(PREFILL_ATTENTION_OP, PREFILL_ATTENTION_FORMS, forced, device, dtype)
    if forced is None and len(forms) == 1:
        return forms[0]  # nothing to choose (sdpa: every CPU, a GPU without triton)
    shape = (
        args.num_heads,
        args.num_kv_heads,
        args.head_dim,
        config.block_size,
        *sum(TUNING_PREFILL_CHUNKS, ()),
    )

    def build() -> dict:
        return prefill_attention_candidates(
            forms,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            dtype,
            device,
            config.block_size,
            TUNING_PREFILL_CHUNKS,
        )

    return tuner.choose(PREFILL_ATTENTION_OP, forms, build, shape, dtype, forced=forced).choice


def _decode_lora(
    tuner: KernelTuner,
    config: EngineConfig,
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device,
    use_packed_linears: bool,
) -> str:
    skipped = _unusable_lora_forms(config, dtype, device)
    forms = tuple(f for f in DECODE_LORA_FORMS if f not in skipped)
    forced = config.decode_lora_form or ("kernel" if config.lora_kernel else None)
    if forced is not None and forced not in forms:
        raise ValueError(
            f"decode_lora_form {forced!r} cannot run here or is turned off ({skipped.get(forced)}); "
            f"usable: {list(forms)}"
        )
    num_seqs = min(TUNING_NUM_SEQS, config.max_num_seqs)
    ranks = tuple(min(TUNING_RANKS[i % len(TUNING_RANKS)], config.max_lora_rank) for i in range(num_seqs))
    slices = projection_slices(
        args.hidden_size, args.intermediate_size, args.num_heads, args.num_kv_heads, args.head_dim
    )
    shape = (
        args.hidden_size,
        args.intermediate_size,
        args.num_heads,
        args.num_kv_heads,
        args.head_dim,
        *ranks,
    )
    build = lambda: decode_lora_candidates(forms, slices, ranks, dtype, device, use_packed_linears)
    choice = tuner.choose(DECODE_LORA_OP, forms, build, shape, dtype, forced=forced, skipped=skipped)
    return choice.choice


def _unusable_lora_forms(config: EngineConfig, dtype: torch.dtype, device: torch.device) -> dict[str, str]:
    """The LoRA forms that are no candidates here (turned off by the config, or unable to run), with why."""
    turned_off = {}
    if config.lora_kernel is False:
        turned_off["kernel"] = "turned off (lora_kernel=False)"
    if config.lora_stack_cache_size <= 0:
        turned_off["stacked"] = "turned off (lora_stack_cache_size=0)"
    reasons = {
        form: turned_off.get(form) or lora_form_unusable_reason(form, device, dtype)
        for form in DECODE_LORA_FORMS
    }
    return {form: reason for form, reason in reasons.items() if reason is not None}


def _decode_step(
    tuner: KernelTuner,
    config: EngineConfig,
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device,
    use_packed_linears: bool,
    decode_attention: str,
) -> str:
    """The decode step's form ("eager" or "compiled"): config.decode_step, else measured on CPU (compiled_decode.py)."""
    skipped = {}
    if device.type != "cpu":
        skipped["compiled"] = (
            "on CUDA decode steps are captured in CUDA graphs instead (LORAHOST_ENGINE_CUDA_GRAPHS)"
        )
    forms = tuple(f for f in DECODE_STEP_FORMS if f not in skipped)
    forced = config.decode_step
    if forced is not None and forced not in forms:
        raise ValueError(f"decode_step {forced!r} cannot run here ({skipped[forced]}); usable: {list(forms)}")
    num_seqs = min(TUNING_NUM_SEQS, config.max_num_seqs)
    shape = (
        args.hidden_size,
        args.intermediate_size,
        args.num_heads,
        args.num_kv_heads,
        args.head_dim,
        num_seqs,
        TUNING_CONTEXT_LEN,
        config.block_size,
        int(use_packed_linears),
        DECODE_ATTENTION_FORMS.index(decode_attention),
    )

    def build() -> dict:
        return decode_step_candidates(
            forms,
            args,
            dtype,
            device,
            use_packed_linears,
            decode_attention,
            num_seqs,
            TUNING_CONTEXT_LEN,
            config.block_size,
            config.compile_budget_s,
        )

    return tuner.choose(DECODE_STEP_OP, forms, build, shape, dtype, forced=forced, skipped=skipped).choice
