"""Autoscaling decisions on hand-made demand."""

from __future__ import annotations

import pytest

from scheduler.placement.placement import default_operating_points
from scheduler.scaling.scaling import BaseModelLoad, ScalingPolicy, decide_scaling

OP = default_operating_points(1000.0)
POLICY = ScalingPolicy(
    OP,
    target_utilisation=0.5,
    min_workers=0,
    max_workers=6,
    scale_to_zero_idle_s=600,
    max_waiting_per_worker=4,
)


def test_idle_scales_to_zero_only_after_the_idle_period():
    before = decide_scaling(BaseModelLoad("m", 1, idle_s=599.0), POLICY)
    after = decide_scaling(BaseModelLoad("m", 1, idle_s=600.0), POLICY)
    assert before.desired_workers == 1
    assert after.desired_workers == 0 and after.reason.startswith("idle")


def test_never_used_model_wants_no_worker():
    assert decide_scaling(BaseModelLoad("m", 0), POLICY).desired_workers == 0


def test_waiting_request_scales_from_zero():
    decision = decide_scaling(BaseModelLoad("m", 0, idle_s=None, num_waiting=1), POLICY)
    assert decision.desired_workers == 1 and decision.live_workers == 0
    assert "scale from zero" in decision.reason


def test_demand_sets_workers_by_the_capacity_model():
    # rank 8: OP = 1000 / 1.128 = 886.5 tokens/s; 2000 tokens/s at 50% utilisation -> ceil(4.51) = 5 workers
    load = BaseModelLoad("m", 2, demand_by_rank={8: 2000.0}, idle_s=1.0)
    decision = decide_scaling(load, POLICY)
    assert decision.desired_workers == 5
    assert decision.demand_tokens_per_s == 2000.0


def test_higher_rank_needs_more_workers_for_the_same_tokens():
    low = decide_scaling(BaseModelLoad("m", 1, demand_by_rank={8: 800.0}, idle_s=1.0), POLICY)
    high = decide_scaling(BaseModelLoad("m", 1, demand_by_rank={128: 800.0}, idle_s=1.0), POLICY)
    assert high.desired_workers > low.desired_workers


def test_burst_in_the_queue_adds_workers():
    decision = decide_scaling(
        BaseModelLoad("m", 2, demand_by_rank={8: 10.0}, idle_s=0.0, num_waiting=20), POLICY
    )
    assert decision.desired_workers == 5 and decision.reason.startswith("queue growth")


def test_max_workers_caps_a_burst_and_min_workers_holds_an_idle_model():
    burst = decide_scaling(BaseModelLoad("m", 2, demand_by_rank={8: 1e6}, idle_s=0.0), POLICY)
    assert burst.desired_workers == 6 and "clamped" in burst.reason
    floor = ScalingPolicy(OP, min_workers=2, max_workers=4)
    assert decide_scaling(BaseModelLoad("m", 3, idle_s=1e9), floor).desired_workers == 2


def test_scale_down_waits_for_the_cooldown_peak():
    # demand fell to almost nothing, but the cooldown window still saw 2000 tokens/s: keep the workers
    load = BaseModelLoad("m", 5, demand_by_rank={8: 10.0}, peak_demand_by_rank={8: 2000.0}, idle_s=1.0)
    assert decide_scaling(load, POLICY).desired_workers == 5
    after = BaseModelLoad("m", 5, demand_by_rank={8: 10.0}, peak_demand_by_rank={8: 10.0}, idle_s=1.0)
    assert decide_scaling(after, POLICY).desired_workers == 1


def test_bad_policy_is_refused():
    with pytest.raises(ValueError):
        ScalingPolicy(OP, min_workers=3, max_workers=2)
    with pytest.raises(ValueError):
        ScalingPolicy(OP, target_utilisation=0.0)
