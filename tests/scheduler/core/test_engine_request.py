"""scheduler/core/engine_request.py: the one request shape, its size rule and the Sequence it becomes."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core.engine_request import EngineRequest, new_sequence, prompt_size_error
from scheduler.core.sampling import SamplingParams


def test_prompt_token_ids_are_kept_as_a_tuple_of_ints_and_the_request_is_frozen() -> None:
    request = EngineRequest("r1", [1, 2, 3], SamplingParams())  # type: ignore[arg-type]
    assert request.prompt_token_ids == (1, 2, 3) and request.num_prompt_tokens == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.adapter_id = "other"  # type: ignore[misc]


def test_the_size_rule_refuses_an_empty_prompt_and_one_that_leaves_no_room_for_output() -> None:
    assert prompt_size_error(0, 8) == "the prompt is empty; send at least one token"
    assert prompt_size_error(7, 8) is None
    message = prompt_size_error(8, 8)
    assert message is not None and "8 tokens" in message and "at most 7 tokens" in message


def test_the_sequence_carries_every_field_and_caps_max_tokens_by_the_room_left() -> None:
    request = EngineRequest(
        "r1",
        (1, 2, 3),
        SamplingParams(max_tokens=10),
        "adapter-01",
        predicted_output_tokens=4,
        tenant_id="t1",
        tenant_weight=2.5,
        cache_namespace="tenant:t1",
    )
    seq = new_sequence(request, max_model_len=8, arrival_time=12.5)
    assert (seq.request_id, seq.prompt_token_ids, seq.adapter_id) == ("r1", [1, 2, 3], "adapter-01")
    assert seq.max_tokens == 5  # 8 - 3 prompt tokens, below the request's 10
    assert (seq.predicted_output_tokens, seq.tenant_id, seq.tenant_weight) == (4, "t1", 2.5)
    assert (seq.cache_namespace, seq.arrival_time) == ("tenant:t1", 12.5)
