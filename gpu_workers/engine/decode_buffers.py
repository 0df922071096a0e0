"""The static inputs of captured decode steps (gpu_workers/engine/decode_graphs.py): one flat int64 tensor on the
device at a fixed address, filled from a pinned host copy before every replay (one host -> device copy a step).

Fields, each a contiguous run of `max_rows` (block_tables: `max_rows` x `max_blocks`), so a bucket of b rows reads
prefixes `[:b]`: input_ids, positions, slot_mapping (the KV slot each new token is written to), seq_lens (context
length with the new token), row_slot (the row's adapter slot, layers/slot_lora.py; -1: none), block_tables.

Rows past the step's batch are padding: token 0 at position 0, its K/V written to `pad_slot` (a page no sequence
owns), a context of that one token, no adapter. A padding row reads nothing but its own padding page and writes
nothing a sequence reads, so its output (discarded) cannot reach a real row. Block-table columns past a row's
pages are never read (the in-place attention forms read positions < seq_len only), so they are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.slot_lora import NO_SLOT

_ROW_FIELDS = ("input_ids", "positions", "slot_mapping", "seq_lens", "row_slot")


@dataclass(frozen=True)
class DecodeRow:
    """One decode entry: its new token, position (= context length - 1), KV pages and adapter slot."""

    token_id: int
    position: int
    block_table: list[int]
    slot: int = NO_SLOT


class DecodeBuffers:
    """Static decode inputs for up to `max_rows` rows and `max_blocks` pages a row (module doc)."""

    def __init__(
        self, max_rows: int, max_blocks: int, block_size: int, pad_page: int, device: torch.device
    ) -> None:
        self.max_rows, self.max_blocks, self.block_size = max_rows, max_blocks, block_size
        self.pad_page = pad_page
        numel = len(_ROW_FIELDS) * max_rows + max_rows * max_blocks
        self.host = torch.zeros(numel, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.device_buffer = torch.zeros(numel, dtype=torch.int64, device=device)
        self._host_rows = self.host[: len(_ROW_FIELDS) * max_rows].view(len(_ROW_FIELDS), max_rows)
        self._host_tables = self.host[len(_ROW_FIELDS) * max_rows :].view(max_rows, max_blocks)
        rows = self.device_buffer[: len(_ROW_FIELDS) * max_rows].view(len(_ROW_FIELDS), max_rows)
        self.input_ids, self.positions, self.slot_mapping, self.seq_lens, self.row_slot = rows.unbind(0)
        self.block_tables = self.device_buffer[len(_ROW_FIELDS) * max_rows :].view(max_rows, max_blocks)
        self.row_index = torch.arange(max_rows, device=device)  # decode rows of a bucket: all of them

    def fill(self, num_rows: int, rows: list[DecodeRow]) -> None:
        """Write `rows` into rows [0, len(rows)) and padding into [len(rows), num_rows), then copy to the device."""
        n = len(rows)
        if n > num_rows or num_rows > self.max_rows:
            raise ValueError(f"{n} rows in a bucket of {num_rows} (at most {self.max_rows})")
        pad_slot = self.pad_page * self.block_size
        self._host_rows[:, :num_rows] = torch.tensor([[0], [0], [pad_slot], [1], [NO_SLOT]])
        self._host_tables[n:num_rows, 0] = self.pad_page
        if rows:
            self._host_rows[:, :n] = torch.tensor(
                [
                    [r.token_id for r in rows],
                    [r.position for r in rows],
                    [self._slot(r) for r in rows],
                    [r.position + 1 for r in rows],
                    [r.slot for r in rows],
                ]
            )
        for i, row in enumerate(rows):
            num_pages = row.position // self.block_size + 1
            self._host_tables[i, :num_pages] = torch.tensor(row.block_table[:num_pages])
        self.device_buffer.copy_(self.host)

    def _slot(self, row: DecodeRow) -> int:
        """The KV slot of the row's new token."""
        return (
            row.block_table[row.position // self.block_size] * self.block_size
            + row.position % self.block_size
        )
