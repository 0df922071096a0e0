"""The kernel tuner's candidates for the attention ops (gpu_workers/engine/kernel_plan.py): each form of decode
and of prefill attention (gpu_workers/engine/layers/attention.py) on random K/V in a shuffled page pool of the
model's shapes, as callables the tuner times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from gpu_workers.engine.layers.attention import (
    TRITON_FORM,
    AttentionMetadata,
    PrefillChunk,
    decode_attention,
    paged_attention,
    prefill_chunk,
    varlen_prefill,
)


def decode_attention_candidates(
    forms: tuple[str, ...],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int,
    num_seqs: int,
    context_len: int,
    num_pools: int = 1,
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each form's decode attention of `num_seqs` sequences of `context_len` tokens over a shuffled page
    pool of random K/V (for gpu_workers/engine/kernel_tuner.py), in the order of `forms`. Successive calls cycle
    through `num_pools` pools (as an engine step goes through its layers): pools that together outgrow the CPU's
    caches make every call read cold pages, as in a real step, where a layer's weights pass between two
    attention calls; hot pages favour the forms that gather."""
    generator = torch.Generator().manual_seed(0)
    num_pages = -(-context_len // block_size)
    num_slots = num_seqs * num_pages * block_size
    pool_k = torch.randn(num_slots, num_kv_heads, head_dim, generator=generator).to(
        dtype=dtype, device=device
    )
    pool_v = torch.randn(num_slots, num_kv_heads, head_dim, generator=generator).to(
        dtype=dtype, device=device
    )
    k_cache, v_cache = pool_k.repeat(num_pools, 1, 1), pool_v.repeat(num_pools, 1, 1)
    q = torch.randn(num_seqs, num_heads, head_dim, generator=generator).to(dtype=dtype, device=device)
    tables = torch.randperm(num_seqs * num_pages, generator=generator).view(num_seqs, num_pages)
    lens = torch.full((num_seqs,), context_len, dtype=torch.long)
    is_real = torch.arange(num_pages * block_size).unsqueeze(0) < lens.unsqueeze(1)
    pad_rows = (~is_real).view(-1).nonzero().squeeze(1)
    has_padding = bool(pad_rows.numel())
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long, device=device),
        prefills=(),
        decode_token_idx=torch.arange(num_seqs, device=device),
        decode_blocks=tables.to(device),
        decode_mask=is_real[:, None, None, :].to(device) if has_padding else None,
        decode_pad_rows=pad_rows.to(device) if has_padding else None,
        is_all_decode=True,
        block_size=block_size,
        decode_lens=lens.to(device),
    )
    pool_tables = [(tables + pool * num_seqs * num_pages).to(device) for pool in range(num_pools)]
    scale = head_dim**-0.5

    def run(form: str) -> Callable[[], torch.Tensor]:
        metas = [replace(meta, decode_blocks=t, decode_form=form) for t in pool_tables]
        calls = iter(range(1 << 62))
        return lambda: decode_attention(q, k_cache, v_cache, metas[next(calls) % num_pools], scale)

    return {form: run(form) for form in forms}


def prefill_attention_candidates(
    forms: tuple[str, ...],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int,
    chunks: tuple[tuple[int, int], ...],
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each prefill form's attention of one step of `chunks` ((q_len, context_len): a whole prompt when equal,
    else a chunk after context_len - q_len cached tokens) over a shuffled page pool of random K/V, writing the new
    K/V as a step does (for gpu_workers/engine/kernel_tuner.py), in the order of `forms`."""
    generator = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=generator).to(dtype=dtype, device=device)
    num_pages = [-(-context_len // block_size) for _, context_len in chunks]
    k_cache, v_cache = (randn(sum(num_pages) * block_size, num_kv_heads, head_dim) for _ in range(2))
    order = torch.randperm(sum(num_pages), generator=generator).tolist()
    num_tokens = sum(q_len for q_len, _ in chunks)
    q = randn(num_tokens, num_heads, head_dim)
    k, v = (randn(num_tokens, num_kv_heads, head_dim) for _ in range(2))
    tables: list[list[int]] = []
    q_starts: list[int] = []
    sdpa_chunks: list[PrefillChunk] = []
    new_slots: list[torch.Tensor] = []
    row = 0
    for (q_len, context_len), pages in zip(chunks, num_pages):
        table, order = order[:pages], order[pages:]
        pos = torch.arange(context_len)
        slots = torch.tensor(table)[pos // block_size] * block_size + pos % block_size  # [context_len]
        sdpa_chunks.append(prefill_chunk(row, context_len - q_len, context_len, slots, device))
        new_slots.append(slots[context_len - q_len :])
        tables.append(table)
        q_starts.append(row)
        row += q_len
    q_lens, context_lens = [q_len for q_len, _ in chunks], [context_len for _, context_len in chunks]
    base = AttentionMetadata(torch.cat(new_slots).to(device), (), None, None, None, None, False, block_size)
    metas = {
        "sdpa": replace(base, prefills=tuple(sdpa_chunks)),
        TRITON_FORM: replace(
            base, varlen_prefill=varlen_prefill(q_starts, q_lens, context_lens, tables, block_size, device)
        ),
    }
    scale = head_dim**-0.5
    run = lambda meta: lambda: paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    return {form: run(metas[form]) for form in forms}
