"""SLO strings."""

from __future__ import annotations

import pytest

from twin.planner.slo import Slo, parse_slo


@pytest.mark.parametrize(
    ("text", "slo"),
    [
        ("ttft_p99=2s", Slo("ttft_p99", 2.0)),
        ("ttft_p50<=250ms", Slo("ttft_p50", 0.25)),
        ("itl_p99=0.05", Slo("itl_p99", 0.05)),
    ],
)
def test_slos_parse(text: str, slo: Slo) -> None:
    assert parse_slo(text) == slo


@pytest.mark.parametrize("text", ["ttft=2s", "ttft_p99", "ttft_p99=fast", "ttft_p99=0s", "ttft_p99=2h"])
def test_bad_slos_say_the_accepted_form(text: str) -> None:
    with pytest.raises(ValueError, match="bad SLO"):
        parse_slo(text)
