"""The two multi-queue sizings: the setting switches between them, the platform's classes ignore adapter size,
held adapters count once, quotas follow measured demand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.admission.batch_policy import make_batch_policy
from scheduler.multiqueue.multiqueue import MultiQueuePolicy
from scheduler.multiqueue.queue_quotas import QueueLoad
from scheduler.multiqueue.queue_sizing import (
    TokenSizing,
    WrsSizing,
    default_max_wait_s,
    demand_quotas,
    first_payers,
    held_adapter_tokens,
    make_sizing,
)
from scheduler.multiqueue.request_size import RequestShape, SizeScale
from settings.engine import EngineSettings

SCALE = SizeScale(max_prompt_tokens=1000, max_output_tokens=1000, max_adapter_bytes=64, min_adapter_bytes=8)


def test_the_setting_switches_between_wrs_and_the_platform_sizing() -> None:
    for sizing, max_wait_s in (("wrs", None), ("tokens", 1.0)):
        engine = EngineSettings(
            batch_policy="multiqueue", multiqueue_sizing=sizing, multiqueue_slo_s=5.0, fair_share=False
        )
        policy = engine.admission_policy()
        assert isinstance(policy, MultiQueuePolicy)
        assert policy.sizing.name == sizing and policy.max_wait_s == max_wait_s
    default = EngineSettings(
        batch_policy="multiqueue", multiqueue_slo_s=5.0, fair_share=False
    ).admission_policy()
    assert (
        isinstance(default, MultiQueuePolicy)
        and default.sizing.name == "tokens"
        and default.max_wait_s == 1.0
    )
    explicit = EngineSettings(
        batch_policy="multiqueue", multiqueue_sizing="tokens", multiqueue_max_wait_s=0.25, fair_share=False
    ).admission_policy()
    assert isinstance(explicit, MultiQueuePolicy) and explicit.max_wait_s == 0.25


def test_an_unknown_sizing_is_refused_naming_the_choices_and_the_variable() -> None:
    with pytest.raises(ValueError, match="LORAHOST_ENGINE_MULTIQUEUE_SIZING"):
        EngineSettings(multiqueue_sizing="bytes")
    with pytest.raises(ValueError, match="wrs"):
        make_batch_policy("multiqueue", sizing="bytes")
    with pytest.raises(ValueError):
        EngineSettings(multiqueue_max_wait_s=0)


def test_platform_classes_come_from_tokens_alone_wrs_scales_them_by_adapter_size() -> None:
    tokens, wrs = make_sizing("tokens", 0.4, 0.6), make_sizing("wrs", 0.4, 0.6)
    assert isinstance(tokens, TokenSizing) and isinstance(wrs, WrsSizing)
    small_adapter, large_adapter = RequestShape(300, 100, 8), RequestShape(300, 100, 64)
    assert tokens.class_size(small_adapter, SCALE) == tokens.class_size(large_adapter, SCALE)
    assert tokens.class_size(small_adapter, SCALE) == pytest.approx(math.log2(401))
    assert wrs.class_size(large_adapter, SCALE) == pytest.approx(8 * wrs.class_size(small_adapter, SCALE))
    assert tokens.class_size(RequestShape(10, 10, 64), SCALE) < tokens.class_size(
        RequestShape(900, 10, 8), SCALE
    )


def test_the_age_bound_defaults_to_a_fifth_of_the_slo_for_tokens_only() -> None:
    assert default_max_wait_s(TokenSizing(), 5.0) == pytest.approx(1.0)
    assert default_max_wait_s(WrsSizing(0.4, 0.6), 5.0) is None
    assert MultiQueuePolicy(sizing="tokens", max_wait_s=math.inf).max_wait_s == math.inf


def test_a_held_adapter_counts_once_however_many_requests_use_it() -> None:
    assert held_adapter_tokens([("a", 320), ("a", 320), ("b", 64), (None, 0), ("a", 320)]) == 384
    assert held_adapter_tokens([]) == 0


def test_only_the_oldest_waiting_request_of_an_adapter_nobody_holds_pays_for_it() -> None:
    waiting = [("r3", "a", 3.0), ("r1", "a", 1.0), ("r2", "b", 2.0), ("r4", "c", 0.5), ("r5", None, 0.0)]
    assert first_payers(waiting, held=["b", None]) == frozenset({"r1", "r4"})
    assert first_payers(waiting, held=[]) == frozenset({"r1", "r2", "r4"})


def test_demand_quotas_split_the_capacity_by_token_seconds() -> None:
    loads = [QueueLoad(400, 1.0, 3.0), QueueLoad(1600, 2.0, 1.0)]  # 1200 vs 3200 token-seconds per second
    assert demand_quotas(loads, 8800) == pytest.approx([2400, 6400])
    no_durations = [QueueLoad(400, 0.0, 3.0), QueueLoad(1600, 0.0, 1.0)]  # by lambda * S: 1200 vs 1600
    assert demand_quotas(no_durations, 2800) == pytest.approx([1200, 1600])
    assert demand_quotas([QueueLoad(0, 0, 0)] * 4, 100) == pytest.approx([25] * 4)
    with pytest.raises(ValueError):
        demand_quotas([], 10)


@given(
    loads=st.lists(
        st.builds(QueueLoad, st.floats(0, 5000), st.floats(0, 60), st.floats(0, 50)), min_size=1, max_size=6
    ),
    capacity=st.floats(0, 1e6),
)
def test_demand_quotas_are_never_negative_and_add_up_to_the_capacity(
    loads: list[QueueLoad], capacity: float
) -> None:
    quotas = demand_quotas(loads, capacity)
    assert all(q >= 0 for q in quotas)
    assert sum(quotas) == pytest.approx(capacity, rel=1e-9, abs=1e-6)
