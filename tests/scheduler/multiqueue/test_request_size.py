"""Weighted request size (Chameleon) and a request's need in KV tokens."""

from __future__ import annotations

import pytest

from scheduler.multiqueue.request_size import (
    RequestShape,
    SizeScale,
    num_adapter_tokens,
    weighted_request_size,
)


def test_wrs_weights_input_and_output_and_scales_by_adapter_size() -> None:
    window = [RequestShape(100, 50, 4000), RequestShape(400, 200, 1000), RequestShape(10, 10, 0)]
    scale = SizeScale.of(window)
    assert scale == SizeScale(
        max_prompt_tokens=400, max_output_tokens=200, max_adapter_bytes=4000, min_adapter_bytes=1000
    )
    # (0.4 * 100/400 + 0.6 * 50/200) * 4000/4000 = 0.25
    assert weighted_request_size(window[0], scale) == pytest.approx(0.25)
    # (0.4 + 0.6) * 1000/4000
    assert weighted_request_size(window[1], scale) == pytest.approx(0.25)


def test_base_model_request_is_floored_at_the_smallest_adapter_not_zero() -> None:
    scale = SizeScale.of(
        [RequestShape(100, 100, 800), RequestShape(100, 100, 200), RequestShape(100, 100, 0)]
    )
    base = weighted_request_size(RequestShape(100, 100, 0), scale)
    assert (
        base
        == pytest.approx(weighted_request_size(RequestShape(100, 100, 200), scale))
        == pytest.approx(0.25)
    )
    longer_base = weighted_request_size(RequestShape(100, 100 // 2, 0), scale)
    assert 0 < longer_base < base  # its token lengths still order it


def test_window_without_adapters_gives_factor_one() -> None:
    scale = SizeScale.of([RequestShape(50, 10, 0), RequestShape(100, 20, 0)])
    assert weighted_request_size(RequestShape(100, 20, 0), scale) == pytest.approx(1.0)
    assert SizeScale.of([]) == SizeScale()


def test_adapter_memory_in_tokens_is_whole_blocks() -> None:
    assert num_adapter_tokens(1000, num_bytes_per_block=300, block_size=16) == 4 * 16
    assert num_adapter_tokens(900, num_bytes_per_block=300, block_size=16) == 3 * 16
    assert num_adapter_tokens(0, num_bytes_per_block=300, block_size=16) == 0
    assert num_adapter_tokens(1000, num_bytes_per_block=0, block_size=16) == 0  # unknown block bytes
