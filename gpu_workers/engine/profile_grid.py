"""What `lorahost profile` times (`ProfileGrid`) and the prompts it times them with (`unique_prompt`): the
one measuring pass (gpu_workers/engine/grid_timer.py) that both the router's profile
(gpu_workers/engine/profiler.py) and the twin's (gpu_workers/engine/twin_profiler.py) are fitted on."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

_PROMPT_COUNTER = itertools.count()


def unique_prompt(num_tokens: int, i: int) -> list[int]:
    """A prompt of `num_tokens` ids that no earlier call returned (its 2nd and 3rd ids count calls), so a timed
    prefill computes the whole prompt instead of hitting the prefix cache (prefix caching is on by default and
    the grid repeats every point)."""
    n = next(_PROMPT_COUNTER)
    prompt = [1, 10 + n % 190, 10 + n // 190 % 190] + [(7 * i + j) % 200 + 10 for j in range(num_tokens - 3)]
    return prompt[:num_tokens]


@dataclass(frozen=True)
class ProfileGrid:
    """What `lorahost profile` times: every batch size x prompt length x rank mix (module doc)."""

    ranks: tuple[int, ...] = (8, 32, 64)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prompt_tokens: tuple[int, ...] = (16, 64)
    num_decode_steps: int = 3
    num_repeats: int = 3  # each grid point is run this many times; the best (lowest) time is kept

    def check(self, max_rank: int, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """ValueError saying what to change when the grid does not fit the engine's limits."""
        if not self.ranks or not self.batch_sizes or not self.prompt_tokens:
            raise ValueError("ranks, batch sizes and prompt lengths need at least one value each")
        if min(self.ranks) < 1 or max(self.ranks) > max_rank:
            raise ValueError(f"ranks must be between 1 and max_rank={max_rank}; got {list(self.ranks)}")
        if min(self.batch_sizes) < 1 or max(self.batch_sizes) > max_num_seqs:
            raise ValueError(
                f"batch sizes must be between 1 and engine_max_num_seqs={max_num_seqs}; got {list(self.batch_sizes)}"
            )
        if (
            min(self.prompt_tokens) < 1
            or max(self.batch_sizes) * max(self.prompt_tokens) > max_num_batched_tokens
        ):
            raise ValueError(
                f"the largest batch x prompt ({max(self.batch_sizes)} x {max(self.prompt_tokens)} tokens) must fit "
                f"one prefill step (engine_max_num_batched_tokens={max_num_batched_tokens}); lower them"
            )
        if self.num_decode_steps < 1 or self.num_repeats < 1:
            raise ValueError("decode steps and repeats must be >= 1")

    def rank_mixes(self, batch_size: int) -> list[tuple[int, ...]]:
        """The rank of each request in the batches of `batch_size` that are timed (0 = base model)."""
        low, high = min(self.ranks), max(self.ranks)
        mixes = [(0,) * batch_size] + [(rank,) * batch_size for rank in self.ranks]
        if batch_size > 1 and low != high:
            mixes.append((high,) + (low,) * (batch_size - 1))
            mixes.append(tuple(high if i % 2 else low for i in range(batch_size)))
        return list(dict.fromkeys(mixes))
