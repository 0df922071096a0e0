"""The usage history the placement job reads (registry/placement_job.py `read_usage_history`), from the twin's
request records instead of usage rows: per adapter (and per base model for requests without one), prompt +
completion tokens of the requests that *started* in each bucket of `bucket_s` ending at `now`, and the last
start per key. A request's completion tokens are those produced by `now` (usage rows are checkpointed while
a stream runs; the twin counts every token at once, not at the metering checkpoint).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from cluster.placement_table import UsageHistory
from twin.request_record import RequestRecord


def usage_history(
    records: Iterable[RequestRecord], now: float, bucket_s: float, num_buckets: int, base_model: str
) -> UsageHistory:
    """The history of `records` (started before `now`) in `num_buckets` buckets, oldest first."""
    adapter_tokens: dict[str, list[float]] = {}
    base_tokens: dict[str, list[float]] = {}
    last_adapter: dict[str, float] = {}
    last_base: dict[str, float] = {}
    for record in records:
        index = bucket_index(record.arrival_s, now, bucket_s, num_buckets)
        if index is None:
            continue
        counts, last = (adapter_tokens, last_adapter) if record.adapter_id else (base_tokens, last_base)
        key = record.adapter_id or base_model
        num_tokens = record.num_prompt_tokens + bisect.bisect_right(record.token_times, now)
        counts.setdefault(key, [0.0] * num_buckets)[index] += float(num_tokens)
        last[key] = max(last.get(key, 0.0), record.arrival_s)
    return UsageHistory(adapter_tokens, base_tokens, last_adapter, last_base)


def bucket_index(started_s: float, now: float, bucket_s: float, num_buckets: int) -> int | None:
    """The bucket [end - bucket_s, end) holding `started_s` (the last one ends at `now`); None outside."""
    age = now - started_s
    if age <= 0:
        return None
    index = num_buckets - math.ceil(age / bucket_s - 1e-12)
    return index if 0 <= index < num_buckets else None
