"""benchmarks/cold_adapter_ttft.py compares like with like: no two requests share a prompt token at the
same position (no prefix-cache hit), and the ratios are of the medians."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from cold_adapter_ttft import distinct_prompt, ttft_ratios


def test_prompts_of_different_requests_differ_at_every_position() -> None:
    prompts = [distinct_prompt(i, 40, vocab_size=64) for i in range(57)]
    for a in range(len(prompts)):
        for b in range(a + 1, len(prompts)):
            assert all(x != y for x, y in zip(prompts[a], prompts[b], strict=True))
    assert all(7 <= t < 64 for p in prompts for t in p)


def test_prompt_index_beyond_the_distinct_range_is_refused() -> None:
    with pytest.raises(ValueError, match="index"):
        distinct_prompt(57, 4, vocab_size=64)


def test_ratios_are_of_the_medians() -> None:
    ratios = ttft_ratios({"warm": 500.0, "assisted": 600.0, "waiting": 1200.0})
    assert ratios == {"assisted_vs_warm": 1.2, "waiting_vs_warm": 2.4, "waiting_vs_assisted": 2.0}
