"""One step's model inputs: token ids, positions, KV slot mappings and attention metadata built from a
scheduled batch (the LoRA side is built by gpu_workers/engine/lora_form_choice.py and passed in)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.attention import AttentionMetadata, PrefillChunk
from gpu_workers.engine.layers.lora import LoraBatch
from scheduler.core.sequence import BatchEntry


@dataclass(frozen=True)
class StepInputs:
    """Tensors and metadata for one forward pass."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attention: AttentionMetadata
    lora: LoraBatch
    sample_rows: torch.Tensor  # [num_sampling] batch rows whose logits are sampled


@dataclass
class _DecodeRows:
    """The decode entries of a step (one new token each): batch row, block table, context length."""

    rows: list[int]
    tables: list[list[int]]
    lens: list[int]


def build_step_inputs(
    entries: list[BatchEntry], lora: LoraBatch, block_size: int, decode_form: str, device: torch.device
) -> StepInputs:
    """Token ids, positions, slot mappings and attention metadata for one step; `decode_form` is the kernel
    plan's decode attention form."""
    ids: list[int] = []
    positions: list[torch.Tensor] = []
    slots: list[torch.Tensor] = []
    prefills: list[PrefillChunk] = []
    decodes = _DecodeRows([], [], [])
    sample_rows: list[int] = []
    for entry in entries:
        seq, start = entry.seq, entry.seq.num_computed_tokens
        end, row = start + entry.num_new_tokens, len(ids)
        ids.extend(seq.token_ids[start:end])
        table = torch.tensor(seq.block_table, dtype=torch.long)
        context_pos = torch.arange(end)
        context_slots = table[context_pos // block_size] * block_size + context_pos % block_size  # [end]
        positions.append(context_pos[start:])
        slots.append(context_slots[start:])
        if entry.num_new_tokens == 1:
            decodes.rows.append(row)
            decodes.tables.append(seq.block_table)
            decodes.lens.append(end)
        else:
            prefills.append(_prefill_chunk(row, start, end, context_slots, device))
        if entry.is_sampling:
            sample_rows.append(row + entry.num_new_tokens - 1)
    slot_mapping = torch.cat(slots).to(device)
    prefills = _batch_equal_prefills(prefills)
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.cat(positions).to(device),
        attention=_attention_metadata(
            slot_mapping, prefills, decodes, len(ids), block_size, decode_form, device
        ),
        lora=lora,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
    )


def _prefill_chunk(
    row: int, start: int, end: int, context_slots: torch.Tensor, device: torch.device
) -> PrefillChunk:
    num_new = end - start
    if start == 0:
        return PrefillChunk(start=row, end=row + num_new, context_slots=None, mask=None)
    q_pos = torch.arange(start, end).unsqueeze(1)  # [num_new, 1]
    mask = torch.arange(end).unsqueeze(0) <= q_pos  # [num_new, end]
    return PrefillChunk(row, row + num_new, context_slots.to(device), mask.to(device))


def _attention_metadata(
    slot_mapping: torch.Tensor,
    prefills: list[PrefillChunk],
    decodes: _DecodeRows,
    num_tokens: int,
    block_size: int,
    decode_form: str,
    device: torch.device,
) -> AttentionMetadata:
    if not decodes.rows:
        return AttentionMetadata(slot_mapping, tuple(prefills), None, None, None, None, False, block_size)
    max_blocks = -(-max(decodes.lens) // block_size)
    tables = torch.zeros(len(decodes.rows), max_blocks, dtype=torch.long)  # pad with block 0 (masked)
    for i, table in enumerate(decodes.tables):
        n = min(len(table), max_blocks)
        tables[i, :n] = torch.tensor(table[:n], dtype=torch.long)
    lens = torch.tensor(decodes.lens, dtype=torch.long)
    if decode_form == "c_kernel":  # reads positions < lens in place: no padding to mask
        pad_rows = is_real = torch.empty(0, dtype=torch.long)
    else:
        pos = torch.arange(max_blocks * block_size)
        is_real = pos.unsqueeze(0) < lens.unsqueeze(1)  # [num_decodes, max_blocks * block_size]
        pad_rows = (
            (~is_real).view(-1).nonzero().squeeze(1)
        )  # rows of the gathered [num_decodes * max_context] K
    return AttentionMetadata(
        slot_mapping=slot_mapping,
        prefills=tuple(prefills),
        decode_token_idx=torch.tensor(decodes.rows, dtype=torch.long, device=device),
        decode_blocks=tables.to(device),
        decode_mask=is_real[:, None, None, :].to(device) if pad_rows.numel() else None,
        decode_pad_rows=pad_rows.to(device) if pad_rows.numel() else None,
        is_all_decode=len(decodes.rows) == num_tokens,
        block_size=block_size,
        decode_lens=lens.to(device),
        decode_form=decode_form,
    )


def _batch_equal_prefills(chunks: list[PrefillChunk]) -> list[PrefillChunk]:
    """Merge adjacent whole-prompt chunks of equal length into one batched chunk (one SDPA call)."""
    merged: list[PrefillChunk] = []
    for chunk in chunks:
        last = merged[-1] if merged else None
        if (
            last is not None
            and chunk.context_slots is None
            and last.context_slots is None
            and last.end == chunk.start
            and (last.end - last.start) // last.num_seqs == chunk.end - chunk.start
        ):
            merged[-1] = PrefillChunk(last.start, chunk.end, None, None, last.num_seqs + 1)
        else:
            merged.append(chunk)
    return merged
