"""Paged-KV attention: write new K/V into the page pool, then prefill chunks and decode tokens in the forms
the kernel plan chose for this machine (gpu_workers/engine/kernel_tuner.py):
- prefill (PREFILL_ATTENTION_FORMS): "sdpa", causal SDPA per chunk (adjacent whole-prompt chunks of equal length
  in one batched call; a chunk after cached or earlier-computed tokens gathers its context from the pages), or
  "triton", every chunk of the step in one varlen kernel reading K/V from the pages in place (CUDA);
- decode (DECODE_ATTENTION_FORMS): one call for all decode tokens.

KV cache per layer: k_cache, v_cache [num_blocks * block_size, num_kv_heads, head_dim] (flat slot view of
[num_blocks, block_size, num_kv_heads, head_dim]); slot = block_id * block_size + offset. The gathering decode
forms copy whole pages (one contiguous block_size * num_kv_heads * head_dim run per page); IN_PLACE_DECODE_FORMS
read the positions below each sequence's length where they are.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu_workers.engine.layers.cpu_kernels import load_cpu_kernels

DECODE_ATTENTION_OP = "decode_attention"
# The forms of decode attention, simplest first: "sdpa" (SDPA over the gathered pages in the model dtype),
# "sdpa_fp32" (the same on fp32 upcasts), "grouped_matmul" (per kv head, its query heads' scores as one batched
# matmul, softmax in fp32, as transformers' eager attention), "c_kernel" (layers/attention_kernel.c: reads the
# pages in place, fp32 throughout; CPU only), "triton" (layers/triton_attention.py: reads the pages in place, one
# program per sequence and kv head, fp32 softmax, split over long contexts; CUDA only). Which is fastest depends
# on the machine: on an AMD EPYC (avx512_bf16, 2 threads, B=16, context 224) bf16 SDPA took 1.77 ms per layer,
# fp32 SDPA 0.26, the grouped matmul 0.19.
DECODE_ATTENTION_FORMS = ("sdpa", "sdpa_fp32", "grouped_matmul", "c_kernel", "triton")
IN_PLACE_DECODE_FORMS = ("c_kernel", "triton")  # read the pages in place: no gathered copy, no padding mask
PREFILL_ATTENTION_OP = "prefill_attention"
PREFILL_ATTENTION_FORMS = ("sdpa", "triton")
TRITON_FORM = "triton"
_C_KERNELS = {torch.bfloat16: "decode_attention_bf16", torch.float32: "decode_attention_f32"}
_TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class PrefillChunk:
    """Tokens [start, end) of the batch are positions [context_len - (end-start), context_len) of one seq.

    context_slots: [context_len] cache slots of the whole context, None when the chunk is the whole context
    (then K/V come straight from this step). mask: [q_len, context_len] bool (True = attend), None = causal.
    num_seqs > 1: [start, end) holds that many adjacent whole-context prompts of equal length (batched).
    """

    start: int
    end: int
    context_slots: torch.Tensor | None
    mask: torch.Tensor | None
    num_seqs: int = 1


def prefill_chunk(
    row: int, start: int, end: int, context_slots: torch.Tensor, device: torch.device
) -> PrefillChunk:
    """Batch rows [row, row + end - start) computing positions [start, end) of a sequence whose context slots
    are `context_slots` ([end]): a whole prompt (start 0) attends to this step's K/V, a later chunk to its
    context gathered from the pages under a causal mask."""
    num_new = end - start
    if start == 0:
        return PrefillChunk(start=row, end=row + num_new, context_slots=None, mask=None)
    q_pos = torch.arange(start, end).unsqueeze(1)  # [num_new, 1]
    mask = torch.arange(end).unsqueeze(0) <= q_pos  # [num_new, end]
    return PrefillChunk(row, row + num_new, context_slots.to(device), mask.to(device))


@dataclass(frozen=True)
class VarlenPrefill:
    """Every prefill chunk of a step for one varlen kernel call ("triton" prefill form): chunk i is batch rows
    [q_starts[i], q_starts[i] + q_lens[i]), positions [context_lens[i] - q_lens[i], context_lens[i]) of its
    sequence, whose K/V (cached prefix, earlier chunks and this chunk, all in the pool before attention runs)
    are read in place from the pages of block_tables[i].

    q_starts, q_lens, context_lens: [num_chunks] int32; block_tables: [num_chunks, max_blocks] int64 (padding
    page 0 is never read); max_q_len: the longest chunk (a host int: the kernel's launch grid).
    """

    q_starts: torch.Tensor
    q_lens: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_q_len: int


def varlen_prefill(
    q_starts: list[int],
    q_lens: list[int],
    context_lens: list[int],
    tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> VarlenPrefill:
    """The VarlenPrefill of chunks given as host lists (`tables`: each chunk's sequence's block table, at least
    its context's pages)."""
    max_blocks = max(-(-n // block_size) for n in context_lens)
    block_tables = torch.zeros(len(tables), max_blocks, dtype=torch.long)  # padding: page 0, never read
    for i, (table, n) in enumerate(zip(tables, context_lens)):
        used = -(-n // block_size)
        block_tables[i, :used] = torch.tensor(table[:used], dtype=torch.long)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int32, device=device)
    return VarlenPrefill(
        as_tensor(q_starts), as_tensor(q_lens), as_tensor(context_lens), block_tables.to(device), max(q_lens)
    )


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer.

    slot_mapping: [num_tokens] cache slot of each new token.
    decode_token_idx: [num_decodes] batch rows of single-token (decode) queries, or None.
    decode_blocks: [num_decodes, max_blocks] KV pages to gather (padding uses page 0, which may be another
        sequence's: masked out).
    decode_mask: [num_decodes, 1, 1, max_blocks * block_size] bool, True where the context position is real
        (< the sequence's length); None when no position is padding.
    decode_pad_rows: [num_padding] rows of the gathered [num_decodes * max_blocks * block_size] positions that
        are padding (~decode_mask), or None.
    block_size: tokens per KV page.
    decode_lens: [num_decodes] int64 context length of each decode (the in-place forms read positions below it).
    decode_form: one of DECODE_ATTENTION_FORMS.
    varlen_prefill: the step's prefill chunks for the "triton" prefill form (then `prefills` is empty), or None.

    Isolation: a padding position's K (another sequence's page, or a stale slot of a freed page) is *set* to
    0 in the gathered copy before scoring, so its score is exactly q . 0 = 0 before the mask makes it -inf
    (never inf + -inf = NaN), and every value written to the cache is finite, so its V times probability 0
    is exactly 0: a neighbour that overflowed cannot reach another sequence's output.
    """

    slot_mapping: torch.Tensor
    prefills: tuple[PrefillChunk, ...]
    decode_token_idx: torch.Tensor | None
    decode_blocks: torch.Tensor | None
    decode_mask: torch.Tensor | None
    decode_pad_rows: torch.Tensor | None
    is_all_decode: bool
    block_size: int
    decode_lens: torch.Tensor | None = None
    decode_form: str = "sdpa"
    varlen_prefill: VarlenPrefill | None = None


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D] for the new tokens -> output [T, Hq, D]."""
    # finite in the cache (NaN -> 0, +-inf -> +-max): a masked slot times probability 0 is exactly 0
    k_cache.index_copy_(0, meta.slot_mapping, torch.nan_to_num(k))
    v_cache.index_copy_(0, meta.slot_mapping, torch.nan_to_num(v))
    out = torch.empty_like(q) if not meta.is_all_decode else None
    if meta.varlen_prefill is not None:
        assert out is not None
        _varlen_prefill_attention(q, k_cache, v_cache, meta, scale, out)
    for chunk in meta.prefills:
        assert out is not None
        out[chunk.start : chunk.end] = _prefill_attention(q, k, v, k_cache, v_cache, chunk, scale)
    if meta.decode_token_idx is None:
        assert out is not None
        return out
    decoded = decode_attention(q, k_cache, v_cache, meta, scale)
    if out is None:
        return decoded
    out.index_copy_(0, meta.decode_token_idx, decoded)
    return out


def _prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one prompt chunk (or num_seqs equal whole prompts) -> [q_len, Hq, D]."""
    n = chunk.num_seqs
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_c = q[chunk.start : chunk.end].view(n, -1, num_heads, head_dim).transpose(1, 2)  # [n, Hq, q_len, D]
    if chunk.context_slots is None:
        k_c = k[chunk.start : chunk.end].view(n, -1, num_kv_heads, head_dim).transpose(1, 2)  # [n, Hkv, L, D]
        v_c = v[chunk.start : chunk.end].view(n, -1, num_kv_heads, head_dim).transpose(1, 2)
    else:
        k_c = k_cache.index_select(0, chunk.context_slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, ctx, D]
        v_c = v_cache.index_select(0, chunk.context_slots).transpose(0, 1).unsqueeze(0)
    o = F.scaled_dot_product_attention(
        q_c, k_c, v_c, attn_mask=chunk.mask, is_causal=chunk.mask is None, scale=scale, enable_gqa=True
    )
    return o.transpose(1, 2).reshape(chunk.end - chunk.start, num_heads, head_dim)


def _varlen_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Every prefill chunk in one triton varlen launch, written into its rows of `out`."""
    from gpu_workers.engine.layers import triton_attention  # needs triton: only when this form runs

    varlen = meta.varlen_prefill
    assert varlen is not None
    triton_attention.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        varlen.block_tables,
        varlen.q_starts,
        varlen.q_lens,
        varlen.context_lens,
        varlen.max_q_len,
        meta.block_size,
        scale,
        out=out,
    )


def triton_unusable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the triton forms cannot run here (None: they can): they need CUDA, triton and a bf16/fp16/fp32 model
    (Triton's CPU interpreter is a test tool, never a candidate)."""
    if device.type != "cuda":
        return f"the triton attention kernels need CUDA (this engine runs on {device.type})"
    if importlib.util.find_spec("triton") is None:
        return "the triton attention kernels need the triton package (not installed)"
    if dtype not in _TRITON_DTYPES:
        return f"the triton attention kernels take bf16, fp16 or fp32, not {dtype}"
    return None


def is_decode_form_usable(form: str, device: torch.device, dtype: torch.dtype) -> bool:
    """True when `form` can run here (the C kernel: CPU, bf16 or fp32, and a C compiler to build it; triton:
    see triton_unusable_reason; sdpa_fp32 only where the model dtype is narrower: for an fp32 model it is sdpa)."""
    if form == "sdpa_fp32":
        return dtype != torch.float32
    if form == "c_kernel":
        return device.type == "cpu" and dtype in _C_KERNELS and load_cpu_kernels() is not None
    if form == TRITON_FORM:
        return triton_unusable_reason(device, dtype) is None
    return form in DECODE_ATTENTION_FORMS


def is_prefill_form_usable(form: str, device: torch.device, dtype: torch.dtype) -> bool:
    """True when prefill attention `form` can run here (sdpa everywhere; triton: see triton_unusable_reason)."""
    if form == TRITON_FORM:
        return triton_unusable_reason(device, dtype) is None
    return form in PREFILL_ATTENTION_FORMS


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """All single-token queries at once -> [num_decodes, Hq, D], in the form meta.decode_form.

    All forms but the in-place ones (IN_PLACE_DECODE_FORMS) gather whole pages with one index_select per K and V ([B, max_context, Hkv, D],
    the cache layout) and serve each query head group from its kv head (GQA).
    """
    assert meta.decode_blocks is not None and meta.decode_token_idx is not None
    q_d = q if meta.is_all_decode else q.index_select(0, meta.decode_token_idx)  # [B, Hq, D]
    if meta.decode_form == "c_kernel":
        return _c_kernel_decode(q_d, k_cache, v_cache, meta, scale)
    if meta.decode_form == TRITON_FORM:
        return _triton_decode(q_d, k_cache, v_cache, meta, scale)
    num_decodes, max_blocks = meta.decode_blocks.shape
    _, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    max_context = max_blocks * meta.block_size
    flat = meta.decode_blocks.view(-1)
    page = meta.block_size * num_kv_heads * head_dim
    k_d = k_cache.view(-1, page).index_select(0, flat).view(num_decodes, max_context, num_kv_heads, head_dim)
    v_d = v_cache.view(-1, page).index_select(0, flat).view(num_decodes, max_context, num_kv_heads, head_dim)
    if meta.decode_pad_rows is not None:  # padding scores exactly 0 before the mask (see AttentionMetadata)
        k_d.view(num_decodes * max_context, -1).index_fill_(0, meta.decode_pad_rows, 0.0)
    if meta.decode_form == "grouped_matmul":
        group = num_heads // num_kv_heads
        q_g = q_d.view(num_decodes, num_kv_heads, group, head_dim)
        scores = torch.matmul(q_g, k_d.permute(0, 2, 3, 1)).float() * scale  # [B, Hkv, G, max_context]
        if meta.decode_mask is not None:
            scores.masked_fill_(~meta.decode_mask, float("-inf"))  # mask [B, 1, 1, max_context] broadcasts
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out = torch.matmul(probs, v_d.transpose(1, 2))  # [B, Hkv, G, D]
        return out.reshape(num_decodes, num_heads, head_dim)
    wide = torch.float32 if meta.decode_form == "sdpa_fp32" else q.dtype
    out = F.scaled_dot_product_attention(
        q_d.unsqueeze(2).to(wide),
        k_d.transpose(1, 2).to(wide),
        v_d.transpose(1, 2).to(wide),
        attn_mask=meta.decode_mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # [B, Hq, 1, D]
    return out.view(num_decodes, num_heads, head_dim).to(q.dtype)


def _c_kernel_decode(
    q_d: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """layers/attention_kernel.c over the pages in place -> [num_decodes, Hq, D]."""
    assert meta.decode_blocks is not None and meta.decode_lens is not None
    lib = load_cpu_kernels()
    assert lib is not None
    q_d = q_d.contiguous()
    out = torch.empty_like(q_d)
    num_decodes, num_heads, head_dim = q_d.shape
    tables = meta.decode_blocks
    getattr(lib, _C_KERNELS[q_d.dtype])(
        q_d.data_ptr(),
        out.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        meta.decode_lens.data_ptr(),
        num_decodes,
        num_heads,
        k_cache.shape[1],
        head_dim,
        meta.block_size,
        scale,
        torch.get_num_threads(),
    )
    return out


def _triton_decode(
    q_d: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """layers/triton_attention.py over the pages in place -> [num_decodes, Hq, D]."""
    from gpu_workers.engine.layers import triton_attention  # needs triton: only when this form runs

    assert meta.decode_blocks is not None and meta.decode_lens is not None
    return triton_attention.paged_decode_attention(
        q_d, k_cache, v_cache, meta.decode_blocks, meta.decode_lens, meta.block_size, scale
    )
