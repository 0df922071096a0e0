"""Per-queue token quotas: M/M/1 minima, the remainder by demand, proportional scale-down."""

from __future__ import annotations

import pytest

from scheduler.multiqueue.queue_quotas import QueueLoad, min_quota_tokens, split_quotas


def test_minimum_is_the_mm1_rule() -> None:
    # S = 200 tokens, D = 2 s, lambda = 3/s, SLO 0.5 s: Tok_min = 200 * 2 * (1/0.5 + 3) = 2000
    assert min_quota_tokens(QueueLoad(200, 2.0, 3.0), slo_s=0.5) == pytest.approx(2000)
    # with that quota mu = Tok / (S * D) = 5/s and T = 1 / (mu - lambda) = 0.5 s: exactly the SLO
    assert 1 / (2000 / (200 * 2.0) - 3.0) == pytest.approx(0.5)


def test_remainder_is_split_by_demand_rate() -> None:
    loads = [QueueLoad(100, 1.0, 4.0), QueueLoad(1000, 4.0, 1.0)]
    # minima (SLO 2 s): 100*1*(0.5+4) = 450; 1000*4*(0.5+1) = 6000; remainder 10000 - 6450 = 3550
    # demand rates lambda*S: 400 and 1000 -> shares 2/7 and 5/7
    quotas = split_quotas(loads, capacity_tokens=10_000, slo_s=2.0)
    assert quotas == pytest.approx([450 + 3550 * 2 / 7, 6000 + 3550 * 5 / 7])
    assert sum(quotas) == pytest.approx(10_000)


def test_minima_above_capacity_are_scaled_down_proportionally() -> None:
    loads = [QueueLoad(100, 1.0, 4.0), QueueLoad(1000, 4.0, 1.0)]  # minima 450 and 6000 at SLO 2 s
    quotas = split_quotas(loads, capacity_tokens=1290, slo_s=2.0)
    assert quotas == pytest.approx([90, 1200])  # both x 1290/6450 = 0.2


def test_without_any_load_the_capacity_is_split_evenly() -> None:
    assert split_quotas([QueueLoad(0, 0, 0)] * 4, 1000, slo_s=5.0) == pytest.approx([250] * 4)
    assert split_quotas([QueueLoad(0, 0, 0)], 640, slo_s=5.0) == pytest.approx([640])


def test_no_measured_duration_leaves_no_minimum_and_splits_by_demand() -> None:
    loads = [QueueLoad(10, 0.0, 3.0), QueueLoad(90, 0.0, 1.0)]  # demand 30 and 90
    assert split_quotas(loads, 1200, slo_s=1.0) == pytest.approx([300, 900])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="slo_s"):
        min_quota_tokens(QueueLoad(1, 1, 1), slo_s=0)
    with pytest.raises(ValueError, match=">= 0"):
        QueueLoad(-1, 1, 1)
    with pytest.raises(ValueError, match="at least one queue"):
        split_quotas([], 10, 1.0)
    with pytest.raises(ValueError, match="capacity_tokens"):
        split_quotas([QueueLoad(1, 1, 1)], -1, 1.0)
