"""CostModel on tiny shapes, every expected time worked out by hand from tests/twin/profile_helpers.py's
round coefficients (microseconds): fixed 100, prefill token 2, attention unit 0.01, decode row 5, context
token 0.1, LoRA token*rank 0.05, per adapter 20, per adapter rank 0.5."""

from __future__ import annotations

import pytest

from scheduler.core.step_cost import StepCostTerms
from scheduler.routing.perf_model import LinearLatency
from tests.twin.profile_helpers import tiny_profile
from twin.cost_model import CostModel
from twin.step_shape import StepShape

PREFILL = StepShape(num_prefill_tokens=100, num_prefill_seqs=1, prefill_attention_tokens=5000.0)


def test_an_empty_step_costs_nothing() -> None:
    assert CostModel(tiny_profile(scheduler_us=50.0)).step_seconds(StepShape()) == 0.0


def test_a_base_model_prefill_pays_tokens_and_quadratic_attention() -> None:
    # 100 + 2*100 + 0.01*5000 = 350 us
    assert CostModel(tiny_profile()).step_seconds(PREFILL) == pytest.approx(350e-6)


def test_a_decode_step_pays_rows_and_context_read() -> None:
    shape = StepShape(num_decode_seqs=4, decode_context_tokens=1000)
    # 100 + 5*4 + 0.1*1000 = 220 us
    assert CostModel(tiny_profile()).step_seconds(shape) == pytest.approx(220e-6)


def test_lora_sum_form_charges_each_tokens_rank_and_each_distinct_adapter() -> None:
    shape = StepShape(
        num_prefill_tokens=10,
        num_prefill_seqs=1,
        num_decode_seqs=2,
        lora_token_ranks=((10, 8), (1, 8), (1, 64)),
        adapter_ranks=(8, 64),
    )
    # dense 2*10 + 5*2 = 30; lora 0.05*(80 + 8 + 64) + 20*2 + 0.5*72 = 7.6 + 40 + 36 = 83.6; + fixed 100
    assert CostModel(tiny_profile()).step_seconds(shape) == pytest.approx(213.6e-6)


def test_lora_max_form_pads_every_token_to_the_largest_rank() -> None:
    shape = StepShape(num_decode_seqs=3, lora_token_ranks=((1, 8), (1, 8), (1, 64)), adapter_ranks=(8, 64))
    # dense 15; lora 0.05*3*64 + 40 + 36 = 85.6; + 100
    model = CostModel(tiny_profile(lora_form="max"))
    assert model.step_seconds(shape) == pytest.approx(200.6e-6)
    assert model.step_seconds(shape) > CostModel(tiny_profile()).step_seconds(shape)


def test_the_dense_floor_and_the_adapter_multiplier() -> None:
    model = CostModel(
        tiny_profile(
            min_dense_us=300.0, lora_multiplier_base=2.0, lora_multiplier_per_adapter=0.5, lora_step_us=4.0
        )
    )
    base = StepShape(num_decode_seqs=2)
    assert model.step_seconds(base) == pytest.approx((100 + 300) * 1e-6)  # 10 us of rows under the 300 floor
    lora = StepShape(num_decode_seqs=2, lora_token_ranks=((1, 4), (1, 4)), adapter_ranks=(4,))
    # (100 + 300 + (0.05*8 + 20 + 0.5*4 + 4)) * (2 + 0.5*1) = 426.4 * 2.5
    assert model.step_seconds(lora) == pytest.approx(1066e-6)


def test_cpu_assisted_prefill_overlaps_the_device_and_the_slowest_worker_decides() -> None:
    shape = StepShape(num_prefill_tokens=100, num_prefill_seqs=2, host_token_ranks=((60, 32), (40, 64)))
    slow_host = CostModel(tiny_profile(host_prefill_per_token_rank_us=0.5, scheduler_us=7.0))
    # device 100 + 200 = 300; host workers 0.5*1920 = 960 and 0.5*2560 = 1280 -> 7 + max(300, 1280)
    assert slow_host.host_prefill_seconds(shape) == pytest.approx(1280e-6)
    assert slow_host.step_seconds(shape) == pytest.approx(1287e-6)
    fast_host = CostModel(tiny_profile(host_prefill_per_token_rank_us=0.01))
    assert fast_host.step_seconds(shape) == pytest.approx(
        300e-6
    )  # 25.6 us of host work hides under the device


def serial_host(**step: float) -> CostModel:
    profile = tiny_profile(**step)
    return CostModel(
        profile.model_copy(
            update={"step": profile.step.model_copy(update={"is_host_prefill_overlapped": False})}
        )
    )


def test_a_host_assisted_prefill_the_device_waits_for_adds_its_host_part() -> None:
    shape = StepShape(num_prefill_tokens=100, num_prefill_seqs=2, host_token_ranks=((60, 32), (40, 64)))
    model = serial_host(host_prefill_step_us=40.0, host_prefill_per_token_rank_us=0.01, scheduler_us=7.0)
    # device 100 + 200 = 300; host 40 + 0.01 * max(1920, 2560) = 65.6; they add: 7 + 365.6
    assert model.host_prefill_seconds(shape) == pytest.approx(65.6e-6)
    assert model.step_seconds(shape) == pytest.approx(372.6e-6)
    overlapped = CostModel(tiny_profile(host_prefill_step_us=40.0, host_prefill_per_token_rank_us=0.01))
    assert overlapped.step_seconds(shape) == pytest.approx(300e-6)  # hidden under the device
    no_host = StepShape(num_prefill_tokens=100, num_prefill_seqs=2)
    assert model.step_seconds(no_host) == pytest.approx(307e-6)  # the per-step part needs host entries


def test_a_copy_landing_mid_step_ends_the_added_host_part_at_that_layer() -> None:
    shape = StepShape(num_prefill_tokens=100, num_prefill_seqs=1, host_token_ranks=((100, 100),))
    model = serial_host(host_prefill_per_token_rank_us=0.03)  # device 300 us + host 300 us = 600 us
    assert model.step_seconds(shape) == pytest.approx(600e-6)
    assert model.step_seconds(shape, max_host_seconds=1.0) == pytest.approx(600e-6)  # lands after the step
    # lands at 150 us: a quarter of the layers on the host copy, the rest 300 us x 3/4 on the device copy
    assert model.step_seconds(shape, max_host_seconds=150e-6) == pytest.approx(375e-6)
    assert model.step_seconds(shape, max_host_seconds=0.0) == pytest.approx(300e-6)  # landed: device only


def test_copies_pay_a_latency_and_the_link_bandwidth() -> None:
    model = CostModel(tiny_profile())
    assert model.copy_seconds(0) == 0.0
    assert model.copy_seconds(2_000_000) == pytest.approx(10e-6 + 1e-3)  # 2 MB at 2 GB/s
    # tiny shape: per layer (8+8) + 2*(8+4) + (8+8) + 2*(8+16) + (16+8) = 128 params per rank, x 2 layers x 2 bytes
    assert tiny_profile().model.adapter_bytes(4) == 4 * 512
    assert model.adapter_copy_seconds(4) == pytest.approx(10e-6 + 2048 / 2e9)


def test_the_twin_prices_tokens_and_lora_work_with_the_routers_shared_terms() -> None:
    model = CostModel(tiny_profile(lora_form="max"))
    assert model.terms == StepCostTerms(per_token=2.0, per_seq=5.0, per_token_rank=0.05, lora_form="max")
    token_ranks = ((10, 8), (30, 16))
    router = LinearLatency(
        intercept_ms=0.0, per_unit_ms=0.0, per_rank_ms=0.05, rank_form="max", per_token=True
    )
    assert model.terms.lora_cost(token_ranks) == router.predict_ms(token_ranks)
