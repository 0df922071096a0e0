"""StepShape from the core's BatchEntry objects: prefill chunks (with their quadratic attention work), decode
rows (with the context they read), LoRA pairs per device adapter, and CPU-assisted entries apart."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry, Sequence
from twin.step_shape import StepShape

RANKS = {"a": 8, "b": 16, "c": 64}


def entry(
    num_prompt: int, num_computed: int, num_new: int, adapter: str | None = None, num_outputs: int = 0
) -> BatchEntry:
    seq = Sequence(
        f"r{num_prompt}-{num_computed}-{adapter}", list(range(num_prompt)), SamplingParams(), adapter, 16
    )
    seq.token_ids.extend(range(num_outputs))
    seq.num_computed_tokens = num_computed
    return BatchEntry(seq, num_new)


def test_a_mixed_step_counts_prefill_chunks_and_decode_rows_apart() -> None:
    entries = [
        entry(10, 0, 10, "a"),  # whole prompt at once
        entry(100, 40, 20, "b"),  # a middle chunk after 40 tokens of context
        entry(5, 5, 1, None, num_outputs=1),  # decode reading 5 + 1 tokens
        entry(30, 32, 1, "a", num_outputs=3),  # decode reading 32 + 1 tokens
    ]
    shape = StepShape.of(entries, RANKS, set())
    assert shape.num_prefill_seqs == 2 and shape.num_prefill_tokens == 30
    assert shape.prefill_attention_tokens == 10 * (0 + 5) + 20 * (40 + 10)  # 50 + 1000
    assert shape.num_decode_seqs == 2 and shape.decode_context_tokens == 6 + 33
    assert shape.num_batched_tokens == 32
    assert shape.lora_token_ranks == ((10, 8), (20, 16), (1, 8))
    assert shape.adapter_ranks == (8, 16) and shape.num_distinct_adapters == 2 and shape.max_rank == 16
    assert shape.host_token_ranks == () and shape.num_host_assisted_tokens == 0


def test_host_assisted_entries_leave_the_device_lora_work() -> None:
    entries = [entry(50, 0, 50, "c"), entry(20, 0, 20, "a"), entry(8, 8, 1, "a", num_outputs=1)]
    shape = StepShape.of(entries, RANKS, {"c"})
    assert shape.host_token_ranks == ((50, 64),) and shape.num_host_assisted_tokens == 50
    assert shape.lora_token_ranks == ((20, 8), (1, 8))
    assert shape.adapter_ranks == (8,) and shape.max_rank == 8
    assert shape.num_prefill_tokens == 70  # the base model still runs the host-assisted tokens


def test_no_entries_is_the_empty_shape() -> None:
    shape = StepShape.of([], RANKS, set())
    assert shape == StepShape() and shape.is_empty and shape.max_rank == 0


def test_an_adapter_without_a_rank_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'zz'"):
        StepShape.of([entry(4, 0, 4, "zz")], RANKS, set())


@given(
    st.lists(
        st.tuples(
            st.integers(1, 40), st.integers(0, 45), st.integers(1, 8), st.sampled_from([None, "a", "b", "c"])
        ),
        max_size=12,
    ),
    st.sets(st.sampled_from(["a", "b", "c"])),
)
def test_every_token_is_counted_once(rows: list[tuple[int, int, int, str | None]], host: set[str]) -> None:
    entries = [entry(p, c, n, a, num_outputs=max(0, c + n - p)) for p, c, n, a in rows]
    shape = StepShape.of(entries, RANKS, host)
    assert shape.num_batched_tokens == sum(
        e.num_new_tokens for e in entries if e.seq.num_computed_tokens < e.seq.num_prompt_tokens
    ) + sum(1 for e in entries if e.seq.num_computed_tokens >= e.seq.num_prompt_tokens)
    lora_tokens = sum(t for t, _ in shape.lora_token_ranks) + shape.num_host_assisted_tokens
    assert lora_tokens == sum(e.num_new_tokens for e in entries if e.seq.adapter_id is not None)
    assert set(shape.adapter_ranks) <= {RANKS[a] for a in RANKS if a not in host}
    assert shape.prefill_attention_tokens >= shape.num_prefill_tokens / 2
