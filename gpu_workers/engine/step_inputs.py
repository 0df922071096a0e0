"""One step's model inputs: token ids, positions, KV slot mappings and attention metadata built from a
scheduled batch (the LoRA side is built by gpu_workers/engine/lora_form_choice.py and passed in)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from gpu_workers.engine.layers.attention import (
    IN_PLACE_DECODE_FORMS,
    TRITON_FORM,
    AttentionMetadata,
    PrefillChunk,
    prefill_chunk,
    varlen_prefill,
)
from gpu_workers.engine.layers.lora import LoraBatch
from scheduler.core.sequence import BatchEntry, Sequence


@dataclass(frozen=True)
class StepInputs:
    """Tensors and metadata for one forward pass."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attention: AttentionMetadata
    lora: LoraBatch
    sample_rows: torch.Tensor  # [num_sampling] batch rows whose logits are sampled
    # Rows of prompt positions whose logprobs were asked (SamplingParams.prompt_logprobs); with them the
    # forward outputs `output_rows` (ascending: sample and prompt rows) and `sample_index` picks the sampled
    # ones out of it. Without them both are None and the outputs are the sample rows.
    prompt_rows: tuple[PromptLogprobRows, ...] = ()
    output_rows: torch.Tensor | None = None  # [num_output_rows]
    sample_index: torch.Tensor | None = None  # [num_sampling] indices into output_rows


@dataclass(frozen=True)
class PromptLogprobRows:
    """One entry's prompt positions in a step: output rows `output_index` (into `output_rows`) hold the
    logits at `positions`, whose next tokens are `target_ids` (prompt tokens)."""

    seq: Sequence
    positions: list[int]
    output_index: list[int]
    target_ids: list[int]


@dataclass
class _DecodeRows:
    """The decode entries of a step (one new token each): batch row, block table, context length."""

    rows: list[int]
    tables: list[list[int]]
    lens: list[int]


@dataclass
class _PrefillRows:
    """The prefill entries of a step for the varlen kernel: first batch row, new tokens, context length,
    block table."""

    rows: list[int]
    num_new: list[int]
    lens: list[int]
    tables: list[list[int]]


def build_step_inputs(
    entries: list[BatchEntry],
    lora: LoraBatch,
    block_size: int,
    decode_form: str,
    device: torch.device,
    prefill_form: str = "sdpa",
) -> StepInputs:
    """Token ids, positions, slot mappings and attention metadata for one step; `decode_form` and
    `prefill_form` are the kernel plan's attention forms."""
    ids: list[int] = []
    positions: list[torch.Tensor] = []
    slots: list[torch.Tensor] = []
    prefills: list[PrefillChunk] = []
    varlen = _PrefillRows([], [], [], [])
    decodes = _DecodeRows([], [], [])
    sample_rows: list[int] = []
    outputs = _OutputRows([], [], [])
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
        elif prefill_form == TRITON_FORM:  # K/V read from the pages in place: nothing gathered here
            varlen.rows.append(row)
            varlen.num_new.append(entry.num_new_tokens)
            varlen.lens.append(end)
            varlen.tables.append(seq.block_table)
        else:
            prefills.append(prefill_chunk(row, start, end, context_slots, device))
        outputs.add_prompt_rows(entry, row)
        if entry.is_sampling:
            sample_rows.append(row + entry.num_new_tokens - 1)
            outputs.add_sample_row(row + entry.num_new_tokens - 1)
    slot_mapping = torch.cat(slots).to(device)
    prefills = _batch_equal_prefills(prefills)
    attention = _attention_metadata(
        slot_mapping, prefills, decodes, len(ids), block_size, decode_form, device
    )
    if varlen.rows:
        chunks = varlen_prefill(varlen.rows, varlen.num_new, varlen.lens, varlen.tables, block_size, device)
        attention = replace(attention, varlen_prefill=chunks)
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.cat(positions).to(device),
        attention=attention,
        lora=lora,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
        **outputs.fields(device),
    )


@dataclass
class _OutputRows:
    """The rows a step outputs when some entry asks for prompt logprobs (in row order: ascending)."""

    rows: list[int]
    sample_index: list[int]
    prompt: list[PromptLogprobRows]

    def add_prompt_rows(self, entry: BatchEntry, row: int) -> None:
        """The entry's prompt positions whose next token is a prompt token, when it asks for their logprobs."""
        seq, start = entry.seq, entry.seq.num_computed_tokens
        end = min(start + entry.num_new_tokens, seq.num_prompt_tokens - 1)
        if seq.sampling_params.prompt_logprobs is None or start >= end:
            return
        positions = list(range(start, end))
        index = list(range(len(self.rows), len(self.rows) + len(positions)))
        self.rows.extend(row + p - start for p in positions)
        self.prompt.append(PromptLogprobRows(seq, positions, index, seq.token_ids[start + 1 : end + 1]))

    def add_sample_row(self, row: int) -> None:
        """A sampled row (after the entry's prompt rows: rows stay ascending)."""
        self.sample_index.append(len(self.rows))
        self.rows.append(row)

    def fields(self, device: torch.device) -> dict[str, Any]:
        """StepInputs' prompt_rows, output_rows and sample_index (nothing when no entry asked)."""
        if not self.prompt:
            return {}
        return {
            "prompt_rows": tuple(self.prompt),
            "output_rows": torch.tensor(self.rows, dtype=torch.long, device=device),
            "sample_index": torch.tensor(self.sample_index, dtype=torch.long, device=device),
        }


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
    if decode_form in IN_PLACE_DECODE_FORMS:  # reads positions < lens in place: no padding to mask
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
