"""The forms of a decode-sized step's LoRA delta, for gpu_workers/engine/kernel_tuner.py.

"segmented": one x_seg @ A and one addmm per target per adapter (layers/lora.py; the simplest);
"stacked": the batch's adapters concatenated once per adapter set, every token times every adapter, then a
mask (layers/stacked_lora.py; the runner still takes it only where its cost model says it beats the segment
loop);
"kernel": the C/OpenMP kernel, one call per projection (layers/lora_kernel.py; CPU, when it builds);
"sgmv" / "bgmv": the grouped Triton kernels, one shrink and one expand launch per projection (layers/triton_lora.py;
CUDA, when triton is installed).
Which is fastest depends on the machine, the thread count and the model's shapes, so it is measured.
Every form serves DoRA rows: their rescale is a form of its own added after any of these (layers/dora.py), so
none has to be skipped for a batch with DoRA adapters (only captured decode steps are, decode_graphs.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpu_workers.engine.layers.lora import (
    PROJECTIONS,
    LoraAdapter,
    LoraBatch,
    LoraSegment,
    SegmentedStep,
    add_lora_delta,
    build_lora_projection,
    lora_batch,
)
from gpu_workers.engine.layers.lora_descriptors import adapter_descriptors
from gpu_workers.engine.layers.lora_kernel import (
    KernelStep,
    build_kernel_lora,
    is_kernel_usable,
)
from gpu_workers.engine.layers.stacked_lora import StackedStep, build_stacked_lora, stacked_masks
from gpu_workers.engine.layers.triton_lora import (
    MAX_BGMV_SEGMENT_ROWS,
    TRITON_LORA_FORMS,
    TritonStep,
    build_triton_lora,
    triton_unusable_reason,
)

DECODE_LORA_OP = "decode_lora"
DECODE_LORA_FORMS = ("segmented", "stacked", "kernel", *TRITON_LORA_FORMS)
TUNING_RANKS = (8, 16, 32, 64)  # ranks of the tuning batch's adapters, cycled (capped by the max rank)


def lora_form_unusable_reason(form: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `form` cannot run here, or None when it can (the kernel: CPU, bf16 or fp32, and a C compiler to
    build it; the Triton forms: CUDA and triton, see layers/triton_lora.triton_unusable_reason)."""
    if form == "kernel":
        if is_kernel_usable(device, dtype):
            return None
        return "the C/OpenMP kernel runs on CPU in bfloat16 or float32 and needs a C compiler to build"
    if form in TRITON_LORA_FORMS:
        return triton_unusable_reason(device, dtype)
    return None if form in DECODE_LORA_FORMS else f"{form!r} is not a LoRA form"


def is_lora_form_usable(form: str, device: torch.device, dtype: torch.dtype) -> bool:
    """True when `form` can run here (see lora_form_unusable_reason)."""
    return lora_form_unusable_reason(form, device, dtype) is None


def projection_slices(
    hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> dict[str, tuple[int, dict[str, tuple[int, int]]]]:
    """projection -> (in_features, output column slice of each HF module) of a Llama decoder layer."""
    q, kv, i = num_heads * head_dim, num_kv_heads * head_dim, intermediate_size
    return {
        "qkv": (hidden_size, {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}),
        "o": (q, {"o_proj": (0, hidden_size)}),
        "gate_up": (hidden_size, {"gate_proj": (0, i), "up_proj": (i, 2 * i)}),
        "down": (i, {"down_proj": (0, hidden_size)}),
    }


def decode_lora_candidates(
    forms: tuple[str, ...],
    slices: dict[str, tuple[int, dict[str, tuple[int, int]]]],
    ranks: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    is_packed: bool,
) -> dict[str, Callable[[], object]]:
    """Each form's LoRA delta of one decoder layer (every projection) for a decode batch of one token per
    adapter, adapter i of rank ranks[i] targeting every module, on random weights; in the order of `forms`."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.05).to(dtype=dtype, device=device)

    adapters = []
    for pos, rank in enumerate(ranks):
        layer = {}
        for projection, (in_features, output_slices) in slices.items():
            modules = {
                m: (rand(rank, in_features), rand(c1 - c0, rank)) for m, (c0, c1) in output_slices.items()
            }
            proj = build_lora_projection(modules, projection, output_slices, 2.0, dtype, device)
            assert proj is not None
            layer[projection] = proj
        adapters.append(
            LoraAdapter(
                f"tuning-{pos}", rank, 2.0, tuple(m for s in slices.values() for m in s[1]), (layer,), 0
            )
        )
    num_tokens = len(adapters)
    segments = tuple(LoraSegment(i, i + 1, a) for i, a in enumerate(adapters))
    x = {p: rand(num_tokens, slices[p][0]) for p in PROJECTIONS}
    out = {p: rand(num_tokens, max(c1 for _, c1 in slices[p][1].values())) for p in PROJECTIONS}

    def run(batch: LoraBatch) -> Callable[[], object]:
        def step() -> None:
            for projection in PROJECTIONS:
                add_lora_delta(out[projection], x[projection], batch, 0, projection)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the tuner's clock times the kernels, not their launches

        return step

    batches: dict[str, Callable[[], LoraBatch]] = {
        "segmented": lambda: lora_batch(SegmentedStep(segments)),
        "stacked": lambda: _stacked_batch(segments, is_packed, device),
        "kernel": lambda: _kernel_batch(segments),
        "sgmv": lambda: _triton_batch(segments, 0, device),
        "bgmv": lambda: _triton_batch(segments, MAX_BGMV_SEGMENT_ROWS, device),
    }
    return {form: run(batches[form]()) for form in forms}


def _stacked_batch(segments: tuple[LoraSegment, ...], is_packed: bool, device: torch.device) -> LoraBatch:
    stacked = build_stacked_lora(tuple(seg.adapter for seg in segments), pack=is_packed)
    token_owner = torch.arange(len(segments), dtype=torch.long, device=device)
    return lora_batch(StackedStep(segments, stacked, stacked_masks(stacked, token_owner)))


def _kernel_batch(segments: tuple[LoraSegment, ...]) -> LoraBatch:
    adapters = tuple(seg.adapter for seg in segments)
    kernel = build_kernel_lora(adapters, _tuning_descriptors(adapters))
    return lora_batch(KernelStep.of(kernel, segments))


def _triton_batch(segments: tuple[LoraSegment, ...], max_bgmv_rows: int, device: torch.device) -> LoraBatch:
    adapters = tuple(seg.adapter for seg in segments)
    lora = build_triton_lora(adapters, _tuning_descriptors(adapters), device)
    return lora_batch(TritonStep.of(lora, segments, max_bgmv_rows))


def _tuning_descriptors(adapters: tuple[LoraAdapter, ...]) -> list[torch.Tensor]:
    descriptors = [adapter_descriptors(a) for a in adapters]
    if any(d is None for d in descriptors):
        raise ValueError("the tuning adapters do not fit the LoRA kernels' descriptors")
    return [d for d in descriptors if d is not None]
