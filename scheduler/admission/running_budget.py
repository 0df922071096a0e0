"""An optional bound on the running batch (engine_max_running_tokens), so that requests wait where the batch
policy orders them instead of inside the running batch.

Without it (None, the default) admission stops only when sequence slots, the step's token budget or KV
pages run out; with default settings that leaves a batch of up to `max_num_seqs` sequences whose every step
slows as it grows, and requests almost never wait for admission, so FIFO, SJF and the multi-queue policy
differ only by noise (issue 22 item 5: at most 24 of 64 slots used, P99 TTFT 10.1 / 12.6 / 12.8 s). With a
bound, a request is admitted only while the running sequences' tokens (prompt and output so far: the KV
each step attends over) plus its own prompt stay within `max_running_tokens`; one that does not fit counts
as not fitting for the batch policy's plan (FIFO waits for it, SJF skips it, a multi-queue queue stops).
An empty batch always admits its first request, whatever its size (else it could never run).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunningBudget:
    """The running batch's token bound; `max_running_tokens` None: no bound (today's behaviour)."""

    max_running_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_running_tokens is not None and self.max_running_tokens <= 0:
            raise ValueError(
                f"max_running_tokens must be positive or None (no bound), got {self.max_running_tokens}"
            )

    def may_admit(self, num_running_tokens: int, num_request_tokens: int, num_running: int) -> bool:
        """True when a request of `num_request_tokens` may join `num_running` sequences holding
        `num_running_tokens` tokens."""
        if self.max_running_tokens is None or num_running == 0:
            return True
        return num_running_tokens + num_request_tokens <= self.max_running_tokens
