"""A meter's stages before the first token (api/request_meter.py REQUEST_STAGES): consecutive spans, all or none."""

from __future__ import annotations

import pytest

from api.request_meter import REQUEST_STAGES, RequestMeter


def test_stages_are_consecutive_spans_from_the_start_to_the_first_token() -> None:
    meter = RequestMeter(tenant_id="t")
    meter.started_s = 10.0
    meter.stage_ends_s = {"prepare": 10.002, "route": 10.010, "durable": 10.011}
    meter.first_token_s = 10.015
    durations = meter.stage_durations_ms()
    assert list(durations) == list(REQUEST_STAGES)
    assert durations == pytest.approx({"prepare": 2.0, "route": 8.0, "durable": 1.0, "respond": 4.0})
    assert sum(durations.values()) == pytest.approx(15.0)  # the API's TTFT


def test_a_request_that_did_not_pass_every_stage_has_none() -> None:
    meter = RequestMeter(tenant_id="t")
    meter.mark("prepare")
    meter.mark("route")
    meter.mark("durable")
    assert meter.stage_durations_ms() == {}  # no token was delivered
    meter.on_delivered(1)
    assert set(meter.stage_durations_ms()) == set(REQUEST_STAGES)
    refused = RequestMeter(tenant_id="t")
    refused.mark("prepare")
    refused.on_delivered(1)
    assert refused.stage_durations_ms() == {}
