"""select_lora_rows: the LoraBatch of a subset of batch rows (used by the last layer's sampled-rows MLP)."""

import torch

from gpu_workers.engine.layers.lora import LoraBatch, LoraSegment, SegmentedStep, select_lora_rows
from gpu_workers.engine.layers.stacked_lora import StackedStep


def test_select_lora_rows_segments_and_masks() -> None:
    a, b, c = object(), object(), object()
    # rows 0-3 adapter a, 4-5 no adapter, 6-8 adapter b, 9 adapter c
    segments = (LoraSegment(0, 4, a), LoraSegment(6, 9, b), LoraSegment(9, 10, c))  # type: ignore[arg-type]
    rows = torch.tensor([3, 5, 8, 9])
    got = select_lora_rows(LoraBatch((SegmentedStep(segments),)), rows)
    (form,) = got.forms
    assert isinstance(form, SegmentedStep)
    assert [(s.start, s.end, s.adapter) for s in form.segments] == [(0, 1, a), (2, 3, b), (3, 4, c)]

    masks = (torch.arange(30, dtype=torch.float32).view(10, 3),)
    stacked = StackedStep(segments, stacked=object(), masks=masks)  # type: ignore[arg-type]
    (form,) = select_lora_rows(LoraBatch((stacked,)), rows).forms
    assert isinstance(form, StackedStep) and form.stacked is stacked.stacked
    assert [(s.start, s.end) for s in form.segments] == [(0, 1), (2, 3), (3, 4)]
    assert torch.equal(form.masks[0], masks[0][rows])

    # rows that use no adapter at all -> empty batch
    assert select_lora_rows(LoraBatch((SegmentedStep(segments),)), torch.tensor([4, 5])).is_empty
    assert select_lora_rows(LoraBatch((stacked,)), torch.tensor([4, 5])).is_empty
    assert select_lora_rows(LoraBatch(()), rows).is_empty


def test_a_batch_adds_its_forms_in_order_and_finds_one_by_type() -> None:
    calls: list[str] = []

    class Form:
        def __init__(self, name: str) -> None:
            self.name = name

        def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
            calls.append(f"{self.name}:{layer_idx}:{projection}")

        def select_rows(self, row_list: list[int]) -> "Form | None":
            return None

        def begin_layer(self, layer_idx: int) -> None:
            calls.append(f"{self.name}:begin:{layer_idx}")

    from gpu_workers.engine.layers.lora import add_lora_delta, lora_batch

    first, second = Form("first"), Form("second")
    batch = lora_batch(first, None, second)
    assert batch.forms == (first, second) and not batch.is_empty
    batch.begin_layer(1)
    add_lora_delta(torch.zeros(1, 1), torch.zeros(1, 1), batch, 1, "qkv")
    assert calls == ["first:begin:1", "second:begin:1", "first:1:qkv", "second:1:qkv"]
    assert batch.find(Form) is first and batch.find(SegmentedStep) is None
    assert lora_batch(None).is_empty
