"""The scaling history keeps the newest decisions, oldest first, within its bound."""

from __future__ import annotations

from api.scaling_history import ScalingHistory
from scheduler.scaling.scaling import ScalingDecision


def _decision(base_model: str, desired: int, live: int) -> ScalingDecision:
    return ScalingDecision(base_model=base_model, desired_workers=desired, live_workers=live,
                           demand_tokens_per_s=0.0, reason="test")  # fmt: skip


def test_samples_are_kept_in_order_and_bounded() -> None:
    history = ScalingHistory(max_samples=3)
    history.record([_decision("a", 1, 0), _decision("b", 2, 2)], at_s=1.0)
    history.record([_decision("a", 1, 1), _decision("b", 0, 2)], at_s=2.0)
    samples = history.samples()
    assert [(s.at_s, s.base_model, s.desired_workers, s.live_workers) for s in samples] == [
        (1.0, "b", 2, 2), (2.0, "a", 1, 1), (2.0, "b", 0, 2),
    ]  # fmt: skip
