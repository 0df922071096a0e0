"""benchmarks/twin_tail_audit.py: a request's TTFT split by what it waited for between plans."""

from __future__ import annotations

import pytest

from benchmarks import twin_tail_audit as ta
from twin.request_record import RequestRecord


def test_each_interval_between_plans_is_charged_to_why_the_request_still_waited() -> None:
    recorder = ta._Recorder()
    recorder.events["r"] = [(1.5, "quota"), (2.0, "quota"), (3.0, "closed"), (4.5, "adapter")]
    recorder.admitted_at["r"] = 5.0
    record = RequestRecord("r", arrival_s=1.0, num_prompt_tokens=8, first_scheduled_s=5.0, token_times=[5.25])
    parts = ta.split_ttft(record, recorder)
    assert parts == pytest.approx(
        {
            "arrival": 0.5,
            "quota": 1.5,
            "closed": 1.5,
            "budget": 0.0,
            "kv": 0.0,
            "adapter": 0.5,
            "prefill": 0.25,
        }
    )
    assert sum(parts.values()) == pytest.approx(record.ttft_s)


def test_a_request_admitted_at_its_first_plan_waits_only_for_that_plan_and_its_prefill() -> None:
    record = RequestRecord("r", arrival_s=1.0, num_prompt_tokens=8, first_scheduled_s=1.2, token_times=[1.5])
    recorder = ta._Recorder()
    recorder.admitted_at["r"] = 1.2
    parts = ta.split_ttft(record, recorder)
    assert parts["arrival"] == pytest.approx(0.2) and parts["prefill"] == pytest.approx(0.3)
    assert sum(parts.values()) == pytest.approx(0.5)
