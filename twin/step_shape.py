"""`StepShape`: what one engine step computes, in the numbers a cost model prices (twin/cost_model.py).

Built from the core's own step entries (`scheduler.core.sequence.BatchEntry`), so the engine (profiling) and the
twin (simulating) describe a step the same way. An entry is a decode when its sequence has computed its whole
prompt (`num_computed_tokens >= num_prompt_tokens`), else a prefill chunk of `num_new_tokens` tokens after
`num_computed_tokens` of context.

- prefill_attention_tokens: sum over prefill chunks of new * (context before + new / 2), the quadratic
  attention work of a causal chunk (each new token attends to the context and, on average, half the chunk).
- decode_context_tokens: sum over decode rows of the KV length the row reads (context + its new token).
- lora_token_ranks: (tokens, rank) per entry whose LoRA delta runs on the device (an adapter, not
  host-assisted); adapter_ranks: the rank of each distinct adapter among them (sorted, one per adapter).
- host_token_ranks: (tokens, rank) per entry whose LoRA delta runs on a host copy (CPU-assisted prefill).

Rank 0 is the base model (adapter None): it adds no LoRA work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from scheduler.core.sequence import BatchEntry

TokenRanks = tuple[tuple[int, int], ...]  # (num_tokens, rank) per entry


@dataclass(frozen=True)
class StepShape:
    """One engine step's work (module doc); the empty shape is a step that computes nothing."""

    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    prefill_attention_tokens: float = 0.0
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0
    lora_token_ranks: TokenRanks = ()
    adapter_ranks: tuple[int, ...] = ()
    host_token_ranks: TokenRanks = ()

    @classmethod
    def of(
        cls,
        entries: Iterable[BatchEntry],
        ranks: Mapping[str, int],
        host_assisted: AbstractSet[str] = frozenset(),
    ) -> StepShape:
        """The shape of a step running `entries` (before the step updates them); `ranks`: adapter id -> rank
        (every adapter of the entries; ValueError naming a missing one); `host_assisted`: adapters whose
        entries take their LoRA delta from a host copy this step."""
        prefill_tokens = prefill_seqs = decode_seqs = decode_context = 0
        attention = 0.0
        lora: list[tuple[int, int]] = []
        host: list[tuple[int, int]] = []
        adapters: dict[str, int] = {}
        for entry in entries:
            seq, num_new = entry.seq, entry.num_new_tokens
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                decode_seqs += 1
                decode_context += seq.num_computed_tokens + num_new
            else:
                prefill_seqs += 1
                prefill_tokens += num_new
                attention += num_new * (seq.num_computed_tokens + num_new / 2)
            rank = _rank_of(seq.adapter_id, ranks)
            if rank == 0 or seq.adapter_id is None:
                continue
            if seq.adapter_id in host_assisted:
                host.append((num_new, rank))
            else:
                lora.append((num_new, rank))
                adapters[seq.adapter_id] = rank
        return cls(
            num_prefill_tokens=prefill_tokens,
            num_prefill_seqs=prefill_seqs,
            prefill_attention_tokens=attention,
            num_decode_seqs=decode_seqs,
            decode_context_tokens=decode_context,
            lora_token_ranks=tuple(lora),
            adapter_ranks=tuple(sorted(adapters.values())),
            host_token_ranks=tuple(host),
        )

    @property
    def num_batched_tokens(self) -> int:
        """Tokens the step computes (prefill tokens plus one per decode row)."""
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def is_empty(self) -> bool:
        """True when the step computes nothing."""
        return self.num_batched_tokens == 0

    @property
    def num_distinct_adapters(self) -> int:
        """Adapters whose LoRA delta runs on the device this step."""
        return len(self.adapter_ranks)

    @property
    def max_rank(self) -> int:
        """The largest device-side LoRA rank in the step (0 when none)."""
        return max(self.adapter_ranks, default=0)

    @property
    def num_host_assisted_tokens(self) -> int:
        """Tokens whose LoRA delta runs on a host copy."""
        return sum(tokens for tokens, _ in self.host_token_ranks)


def _rank_of(adapter_id: str | None, ranks: Mapping[str, int]) -> int:
    if adapter_id is None:
        return 0
    try:
        return ranks[adapter_id]
    except KeyError:
        raise ValueError(f"no rank known for adapter {adapter_id!r}: add it to the ranks mapping") from None
