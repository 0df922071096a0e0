"""The kernel tuner's "decode_step" op on CPU: one decoder layer's decode step with its elementwise runs eager or
compiled (layers/pointwise.py), timed on the model's shapes with the plan's linears and decode attention; the
compile is timed first and a compile slower than `compile_budget_s` loses the measurement (kernel_tuner.Unusable).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpu_workers.engine.kernel_tuner import Unusable
from gpu_workers.engine.layers.attention import AttentionMetadata
from gpu_workers.engine.layers.lora import LoraBatch
from gpu_workers.engine.layers.pointwise import EAGER_POINTWISE, PointwiseOps, compiled_pointwise, warm_up
from gpu_workers.engine.layers.rotary import RotaryEmbedding
from gpu_workers.engine.models.llama import DecoderLayer, ModelArgs


def compile_pointwise(
    args: ModelArgs, dtype: torch.dtype, device: torch.device
) -> tuple[PointwiseOps, float]:
    """The compiled elementwise runs for this model, compiled now -> (ops, seconds the compiles took)."""
    ops = compiled_pointwise()
    seconds = warm_up(
        ops,
        args.hidden_size,
        args.intermediate_size,
        args.num_heads,
        args.num_kv_heads,
        args.head_dim,
        dtype,
        device,
    )
    return ops, seconds


def decode_step_candidates(
    forms: tuple[str, ...],
    args: ModelArgs,
    dtype: torch.dtype,
    device: torch.device,
    is_packed: bool,
    decode_form: str,
    num_seqs: int,
    context_len: int,
    block_size: int,
    compile_budget_s: float,
) -> dict[str, Callable[[], object] | Unusable]:
    """Each form's decode step of one decoder layer (random weights, packed when `is_packed`) over `num_seqs`
    sequences of `context_len` tokens, no adapter, attention in `decode_form`; "compiled" compiles first and is
    Unusable when that took longer than compile_budget_s."""
    generator = torch.Generator().manual_seed(0)
    layer = DecoderLayer(args, 0, dtype, device)
    for param in layer.parameters():
        param.data.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    if is_packed:
        for name in ("qkv", "o", "gate_up", "down"):
            getattr(layer, name).pack()
    num_pages = -(-context_len // block_size)
    num_slots = num_seqs * num_pages * block_size
    kv_shape = (num_slots, args.num_kv_heads, args.head_dim)
    kv_cache = (
        torch.randn(kv_shape, generator=generator).to(dtype),
        torch.randn(kv_shape, generator=generator).to(dtype),
    )
    tables = torch.randperm(num_seqs * num_pages, generator=generator).view(num_seqs, num_pages)
    last = context_len - 1
    meta = AttentionMetadata(
        slot_mapping=tables[:, last // block_size] * block_size + last % block_size,
        prefills=(),
        decode_token_idx=torch.arange(num_seqs),
        decode_blocks=tables,
        decode_mask=None,
        decode_pad_rows=None,
        is_all_decode=True,
        block_size=block_size,
        decode_lens=torch.full((num_seqs,), context_len, dtype=torch.long),
        decode_form=decode_form,
    )
    rotary = RotaryEmbedding(args.head_dim, context_len, args.rope, dtype, device)
    cos_sin = rotary.lookup(torch.full((num_seqs,), last, dtype=torch.long))
    h = (torch.randn(num_seqs, args.hidden_size, generator=generator) * 0.5).to(dtype)

    def run(ops: PointwiseOps) -> Callable[[], object]:
        def step() -> torch.Tensor:
            layer.pointwise = ops
            return layer(h, cos_sin, kv_cache, meta, LoraBatch())

        return step

    candidates: dict[str, Callable[[], object] | Unusable] = {}
    for form in forms:
        if form == "eager":
            candidates[form] = run(EAGER_POINTWISE)
            continue
        ops, seconds = compile_pointwise(args, dtype, device)
        if seconds > compile_budget_s:
            candidates[form] = Unusable(
                f"compiling took {seconds:.1f} s, over the budget of {compile_budget_s:g} s (engine_compile_budget_s)"
            )
        else:
            candidates[form] = run(ops)
    return candidates
