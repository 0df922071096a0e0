"""select_lora_rows: the LoraBatch of a subset of batch rows (used by the last layer's sampled-rows MLP)."""

import torch

from gpu_workers.layers.lora import LoraBatch, LoraSegment, select_lora_rows


def test_select_lora_rows_segments_and_masks() -> None:
    a, b, c = object(), object(), object()
    # rows 0-3 adapter a, 4-5 no adapter, 6-8 adapter b, 9 adapter c
    segments = (LoraSegment(0, 4, a), LoraSegment(6, 9, b), LoraSegment(9, 10, c))  # type: ignore[arg-type]
    rows = torch.tensor([3, 5, 8, 9])
    got = select_lora_rows(LoraBatch(segments), rows)
    assert got.stacked is None
    assert [(s.start, s.end, s.adapter) for s in got.segments] == [(0, 1, a), (2, 3, b), (3, 4, c)]

    masks = (torch.arange(30, dtype=torch.float32).view(10, 3),)
    stacked = LoraBatch(segments, stacked=object(), masks=masks)  # type: ignore[arg-type]
    got = select_lora_rows(stacked, rows)
    assert got.stacked is stacked.stacked
    assert torch.equal(got.masks[0], masks[0][rows])

    # rows that use no adapter at all -> empty batch
    assert select_lora_rows(LoraBatch(segments), torch.tensor([4, 5])).is_empty
    assert select_lora_rows(LoraBatch(()), rows).is_empty
