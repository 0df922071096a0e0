"""benchmarks/cold_adapter_gaps.py measures a running stream's gaps inside the cold-adapter window only: the
first token in the window counts from the stream's token before it, tokens outside the window do not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from cold_adapter_gaps import token_gaps


def test_gaps_are_those_of_the_tokens_inside_the_window() -> None:
    stamps = {"a": [0.0, 1.0, 1.5, 4.0, 9.0], "b": [2.0, 2.5]}
    assert sorted(token_gaps(stamps, start=1.2, end=5.0)) == pytest.approx([0.5, 0.5, 2.5])


def test_a_stream_without_tokens_in_the_window_has_no_gap() -> None:
    assert token_gaps({"a": [0.0, 1.0]}, start=2.0, end=3.0) == []
