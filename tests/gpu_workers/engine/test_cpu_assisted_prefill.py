"""CPU-assisted prefill (CaraServe): a request whose adapter is still being copied to the device runs its
prefill as soon as the adapter's host copy is prepared (off the step loop), the LoRA delta from the host copy
on CPU workers, switching to the device copy at a layer boundary once it lands. Outputs equal a fully
resident run; decodes never use the host copy."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry

GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
ADAPTER = "adapter-01"


def record_steps(engine: LLMEngine) -> list[tuple[list[tuple[str, int, int, int]], frozenset[str], Any]]:
    """Wrap runner.execute: per step, (request id, computed, new, prompt) per entry, host-assisted adapters,
    and the sampled rows' logits."""
    steps: list[tuple[list[tuple[str, int, int, int]], frozenset[str], Any]] = []
    execute = engine.runner.execute

    def recording(entries: list[BatchEntry], return_logits: bool = False, **kwargs: Any) -> Any:
        rows = [
            (e.seq.request_id, e.seq.num_computed_tokens, e.num_new_tokens, e.seq.num_prompt_tokens)
            for e in entries
        ]
        tokens, logits = execute(entries, True, **kwargs)
        steps.append(
            (rows, frozenset(kwargs.get("host_assisted", ())), logits.clone() if logits is not None else None)
        )
        return tokens, (logits if return_logits else None)

    engine.runner.execute = recording  # type: ignore[method-assign]
    return steps


def run(engine: LLMEngine, requests: list[tuple[str, list[int], str | None]]) -> dict[str, dict[str, Any]]:
    """Add requests and step to the end; per request: tokens, finish reason, error and the adapter's
    residency when its first token came out."""
    for request_id, prompt, adapter in requests:
        engine.add_request(EngineRequest(request_id, prompt, GREEDY, adapter))
    result: dict[str, dict[str, Any]] = {r: {"tokens": []} for r, _, _ in requests}
    adapters = {r: a for r, _, a in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got = result[out.request_id]
            adapter = adapters[out.request_id]
            if out.new_token_ids and not got["tokens"] and adapter is not None:
                got["residency_at_first_token"] = engine.adapter_residency(adapter)
            got["tokens"] += out.new_token_ids
            if out.is_finished:
                got["finish_reason"], got["error"] = out.finish_reason, out.error
    return result


def cold_engine(
    make_engine: Callable[..., LLMEngine],
    adapter_dirs: dict[str, Path],
    copy_seconds: float | None,
    **kwargs: Any,
) -> LLMEngine:
    """An engine where "cold" (ADAPTER's files) is only on the host; its copy takes about copy_seconds."""
    probe = make_engine(**kwargs)
    if copy_seconds is None:
        probe.register_adapter("cold", adapter_dirs[ADAPTER])
        return probe
    num_bytes = probe.runner.adapters[ADAPTER].num_bytes
    engine = make_engine(adapter_link_gbps=num_bytes / copy_seconds / 1e9, **kwargs)
    engine.register_adapter("cold", adapter_dirs[ADAPTER])
    return engine


@pytest.fixture(scope="module")
def warm_steps(make_engine: Callable[..., LLMEngine], prompt_ids: list[list[int]]) -> tuple[list[int], Any]:
    """Greedy tokens and first-step logits of prompt 3 with ADAPTER fully resident (a fresh engine: no
    cached prefix may shorten its first step)."""
    engine = make_engine()
    steps = record_steps(engine)
    [out] = engine.generate([prompt_ids[3]], GREEDY, adapter_ids=[ADAPTER])
    return out.token_ids, steps[0][2]


@pytest.mark.parametrize("switch_layer", [0, 1, 2])
def test_switching_to_the_device_copy_at_any_layer_gives_the_resident_run(
    make_engine: Any,
    adapter_dirs: dict[str, Path],
    prompt_ids: list[list[int]],
    warm_steps: Any,
    switch_layer: int,
) -> None:
    engine = cold_engine(make_engine, adapter_dirs, 0.5)  # still copying when its prefill runs
    assert switch_layer <= engine.runner.args.num_layers == 2
    engine.runner.host_switch_layer = switch_layer  # layers [0, k) on the host copy, then the device copy
    steps = record_steps(engine)
    got = run(engine, [("r", prompt_ids[3], "cold")])["r"]
    warm_tokens, warm_logits = warm_steps
    assert steps[0][1] == {"cold"} and engine.runner.last_switched_at == {"cold": switch_layer}
    if engine.runner.device.type == "cpu":
        assert torch.equal(steps[0][2], warm_logits)  # fp32, same ops: bit-identical
    else:  # the host layers ran on the CPU, the resident run's on the GPU: same math, other rounding
        torch.testing.assert_close(steps[0][2], warm_logits, atol=1e-5, rtol=1e-5)
    assert got["tokens"] == warm_tokens
    assert engine.engine_stats().num_cpu_assisted_prefills == 1


def test_chunked_cold_prefill_gives_the_resident_tokens(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]], warm_steps: Any
) -> None:
    engine = cold_engine(make_engine, adapter_dirs, 0.3, max_num_batched_tokens=4)
    steps = record_steps(engine)
    got = run(engine, [("r", prompt_ids[3], "cold")])["r"]
    assert got["tokens"] == warm_steps[0]
    assert sum("cold" in host for _, host, _ in steps) >= 2  # several chunks ran on the host copy


def test_first_token_arrives_before_the_copy_lands_only_with_cpu_assistance(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]], warm_steps: Any
) -> None:
    assisted = cold_engine(make_engine, adapter_dirs, 1.0)
    waiting = cold_engine(make_engine, adapter_dirs, 1.0, cpu_prefill_workers=0)
    got = run(assisted, [("r", prompt_ids[3], "cold")])["r"]
    assert got["residency_at_first_token"] == "copying" and got["tokens"] == warm_steps[0]
    got = run(waiting, [("r", prompt_ids[3], "cold")])["r"]
    assert got["residency_at_first_token"] == "device" and got["tokens"] == warm_steps[0]
    assert (
        waiting.engine_stats().num_cpu_assisted_prefills == 0 and waiting.engine_stats().num_copy_waits == 1
    )
    assert assisted.runner_stats().num_adapter_copies == waiting.runner_stats().num_adapter_copies == 1
    assert assisted.runner_stats().adapter_copy_seconds_total >= 1.0


def test_decode_waits_for_the_device_copy_and_never_runs_on_the_host_copy(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]], warm_steps: Any
) -> None:
    engine = cold_engine(make_engine, adapter_dirs, 0.5)
    steps = record_steps(engine)
    got = run(engine, [("r", prompt_ids[3], "cold"), ("base", prompt_ids[0], None)])
    assert got["r"]["tokens"] == warm_steps[0]
    for rows, host, _ in steps:
        assert host <= {"cold"}
        for request_id, num_computed, _, num_prompt in rows:
            if request_id == "r" and host:
                assert num_computed < num_prompt  # prefill only
    # the base request kept decoding while "r" waited for the copy after its prefill
    assert any(not host and [r for r, *_ in rows] == ["base"] for rows, host, _ in steps)
    assert engine.engine_stats().num_copy_waits == 1


def test_busy_cpu_pool_falls_back_to_waiting_for_the_copy(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]], warm_steps: Any
) -> None:
    engine = cold_engine(make_engine, adapter_dirs, 0.5, cpu_prefill_workers=1)
    steps = record_steps(engine)
    got = run(engine, [("first", prompt_ids[3], "cold"), ("second", prompt_ids[3], "cold")])
    rows, host, _ = steps[0]
    assert [r for r, *_ in rows] == ["first"] and host == {
        "cold"
    }  # the one worker was taken: "second" waited
    assert got["first"]["residency_at_first_token"] == "copying"
    assert got["first"]["tokens"] == got["second"]["tokens"] == warm_steps[0]
    assert (
        engine.engine_stats().num_copy_waits == 2
    )  # "second" for the worker, "first" before its first decode


def test_removed_adapter_files_fail_only_that_adapters_requests(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]], tmp_path: Path
) -> None:
    engine = make_engine()
    shutil.copytree(adapter_dirs[ADAPTER], tmp_path / "gone")
    engine.register_adapter("gone", tmp_path / "gone")
    (tmp_path / "gone" / "adapter_model.safetensors").unlink()
    want = engine.generate([prompt_ids[0]], GREEDY, adapter_ids=[ADAPTER])[0].token_ids
    got = run(engine, [("bad", prompt_ids[3], "gone"), ("ok", prompt_ids[0], ADAPTER)])
    assert got["bad"]["finish_reason"] == "error" and "could not be loaded" in got["bad"]["error"]
    assert got["ok"]["tokens"] == want and got["ok"]["finish_reason"] == "length"
    assert engine.adapter_residency("gone") == "host"


def test_a_copy_failing_on_the_link_fails_only_that_adapters_requests(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = cold_engine(make_engine, adapter_dirs, 0.2)
    copy = engine.runner.transfers.copier.copy

    def failing_copy(host_copy: Any, place: Any = None) -> Any:
        if host_copy.adapter_id == "cold":
            raise RuntimeError("device out of memory")
        return copy(host_copy, place)

    engine.runner.transfers.copier.copy = failing_copy  # type: ignore[method-assign]
    want = engine.generate([prompt_ids[0]], GREEDY, adapter_ids=[ADAPTER])[0].token_ids
    got = run(engine, [("bad", prompt_ids[3], "cold"), ("ok", prompt_ids[0], ADAPTER)])
    assert got["bad"]["finish_reason"] == "error" and "device out of memory" in got["bad"]["error"]
    assert got["ok"]["tokens"] == want
    assert engine.adapter_residency("cold") == "host" and engine.engine_stats().num_adapter_copy_failures == 1
