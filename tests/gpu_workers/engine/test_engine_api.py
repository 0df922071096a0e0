"""Engine API behaviour: abort, refusals, adapter pinning, sampling, stop conditions, streaming text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine.engine_stats import runner_part
from gpu_workers.engine.errors import (
    AdapterInUseError,
    AdapterLoadError,
    AdapterNotLoadedError,
    PromptTooLongError,
)
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def test_abort_frees_blocks_and_reports_abort(fp32_engine: LLMEngine, prompt_ids: list[list[int]]) -> None:
    num_free = fp32_engine.engine_stats().num_free_kv_blocks
    fp32_engine.add_request(EngineRequest("abort-me", prompt_ids[3], GREEDY, "adapter-01"))
    fp32_engine.step()
    assert fp32_engine.engine_stats().num_free_kv_blocks < num_free
    assert fp32_engine.abort("abort-me")
    assert fp32_engine.engine_stats().num_free_kv_blocks == num_free
    [out] = fp32_engine.step()
    assert out.is_finished and out.finish_reason == "abort"
    assert not fp32_engine.has_unfinished_requests()
    assert not fp32_engine.abort("abort-me")


def test_prompt_longer_than_max_model_len_is_refused(make_engine: Any) -> None:
    engine = make_engine(max_model_len=32)
    with pytest.raises(PromptTooLongError, match="max_model_len"):
        engine.add_request(EngineRequest("long", list(range(10, 50)), GREEDY))
    assert not engine.has_unfinished_requests()


def test_unknown_adapter_is_refused(fp32_engine: LLMEngine) -> None:
    with pytest.raises(AdapterNotLoadedError):
        fp32_engine.add_request(EngineRequest("x", [1, 2, 3], GREEDY, "no-such-adapter"))


def test_unload_of_adapter_in_use_is_refused_then_allowed(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = make_engine()
    engine.add_request(EngineRequest("pinned", prompt_ids[0], GREEDY, "adapter-02"))
    with pytest.raises(AdapterInUseError):
        engine.unload_adapter("adapter-02")
    with pytest.raises(AdapterInUseError):
        engine.load_adapter("adapter-02", adapter_dirs["adapter-02"])
    engine.unload_adapter("adapter-01")  # unused adapters unload while others run
    while engine.has_unfinished_requests():
        engine.step()
    engine.unload_adapter("adapter-02")
    assert "adapter-02" not in engine.loaded_adapters()
    engine.load_adapter("adapter-02", adapter_dirs["adapter-02"])
    assert "adapter-02" in engine.loaded_adapters()


def test_invalid_adapter_directory_is_refused(fp32_engine: LLMEngine, tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "PREFIX_TUNING"}')
    with pytest.raises(AdapterLoadError):
        fp32_engine.load_adapter("bad", tmp_path)
    assert "bad" not in fp32_engine.loaded_adapters()


def test_seeded_sampling_is_reproducible_and_batch_independent(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    [a] = fp32_engine.generate([prompt_ids[0]], params, adapter_ids=["adapter-00"])
    b, _ = fp32_engine.generate(
        [prompt_ids[0], prompt_ids[1]], [params, GREEDY], adapter_ids=["adapter-00", None]
    )
    assert a.token_ids == b.token_ids
    [c] = fp32_engine.generate(
        [prompt_ids[0]], SamplingParams(max_tokens=12, seed=8, ignore_eos=True), adapter_ids=["adapter-00"]
    )
    assert c.token_ids != a.token_ids


def test_stop_token_ids_end_generation(fp32_engine: LLMEngine, prompt_ids: list[list[int]]) -> None:
    [full] = fp32_engine.generate([prompt_ids[2]], GREEDY)
    stop_id = full.token_ids[3]
    first = full.token_ids.index(stop_id)
    [out] = fp32_engine.generate(
        [prompt_ids[2]],
        SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop_id,), ignore_eos=True),
    )
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[: first + 1]


def test_stop_string_ends_generation_and_is_not_in_the_text(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    [full] = fp32_engine.generate([prompt_ids[1]], GREEDY, adapter_ids=["adapter-03"])
    text = full.text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop
    params = SamplingParams(max_tokens=10, temperature=0, stop=(stop,), ignore_eos=True)
    [out] = fp32_engine.generate([prompt_ids[1]], params, adapter_ids=["adapter-03"])
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]


def test_streamed_text_deltas_concatenate_to_the_final_text(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    fp32_engine.add_request(EngineRequest("stream", prompt_ids[0], GREEDY, "adapter-04"))
    pieces, ids = [], []
    while fp32_engine.has_unfinished_requests():
        for out in fp32_engine.step():
            pieces.append(out.new_text)
            ids.extend(out.new_token_ids)
            last = out
    assert last.is_finished and last.finish_reason == "length" and last.num_output_tokens == 10
    assert (
        last.first_token_time is not None and last.finish_time >= last.first_token_time >= last.arrival_time
    )
    assert "".join(pieces) == fp32_engine.tokenizer.decode(ids, skip_special_tokens=True)


def test_eos_stops_unless_ignored(fp32_engine: LLMEngine) -> None:
    eos = next(iter(fp32_engine.eos_token_ids))
    [full] = fp32_engine.generate([[1, 5, 6]], GREEDY)
    params = SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(full.token_ids[0],))
    [out] = fp32_engine.generate([[1, 5, 6]], params)
    assert out.finish_reason == "stop" and len(out.token_ids) == 1
    assert eos == 2


@pytest.mark.parametrize(
    "kwargs", [{"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -1}, {"stop": ("",)}]
)
def test_invalid_sampling_params_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_stats_report_counts_and_timings(fp32_engine: LLMEngine, prompt_ids: list[list[int]]) -> None:
    # the shared engine's counters so far depend on which tests ran before: compare with its own request
    before = fp32_engine.engine_stats()
    fp32_engine.add_request(EngineRequest("stats", prompt_ids[0], GREEDY, "adapter-01"))
    while fp32_engine.has_unfinished_requests():
        fp32_engine.step()
    stats = fp32_engine.engine_stats()
    assert stats.num_steps > before.num_steps and stats.step_seconds_total > before.step_seconds_total
    assert stats.num_finished == before.num_finished + 1
    assert stats.num_output_tokens == before.num_output_tokens + GREEDY.max_tokens
    assert runner_part(stats).num_loaded_adapters >= 4 and stats.num_running == 0


def test_first_scheduled_time_ends_the_queueing_of_a_request_that_waited(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(max_num_seqs=1)  # the second request waits for the first to finish
    engine.add_request(EngineRequest("first", prompt_ids[0], GREEDY, "adapter-01"))
    engine.add_request(EngineRequest("second", prompt_ids[1], GREEDY, "adapter-02"))
    last: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            last[out.request_id] = out
    first, second = last["first"], last["second"]
    for out in (first, second):
        assert out.arrival_time <= out.first_scheduled_time <= out.first_token_time <= out.finish_time
    assert second.first_scheduled_time >= first.finish_time
