"""Async wrapper: streaming deltas, cancel aborts, thread-safe adapter management."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine.async_engine import AsyncLLMEngine
from gpu_workers.engine.errors import AdapterInUseError
from gpu_workers.worker.backend import InferenceBackend
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture
def async_engine(make_engine: Any) -> Any:
    engine = AsyncLLMEngine(make_engine())
    yield engine
    engine.shutdown()


def test_async_engine_implements_the_backend_protocol(async_engine: AsyncLLMEngine) -> None:
    assert isinstance(async_engine, InferenceBackend)


def test_concurrent_streams_match_offline_generate(
    async_engine: AsyncLLMEngine, fp32_engine: Any, prompt_ids: list[list[int]]
) -> None:
    adapters = [None, "adapter-00", "adapter-03"]
    expected = fp32_engine.generate(prompt_ids[:3], GREEDY, adapter_ids=adapters)

    async def collect(i: int) -> tuple[list[int], str, str | None]:
        ids, text, reason = [], "", None
        async for out in async_engine.generate_stream(
            EngineRequest(f"s{i}", prompt_ids[i], GREEDY, adapters[i])
        ):
            ids.extend(out.new_token_ids)
            text += out.new_text
            reason = out.finish_reason
        return ids, text, reason

    async def main() -> list:
        return await asyncio.gather(*(collect(i) for i in range(3)))

    results = asyncio.run(main())
    for (ids, text, reason), exp in zip(results, expected):
        assert ids == exp.token_ids and text == exp.text and reason == "length"


def test_cancelling_a_stream_aborts_the_request_and_frees_pages(
    async_engine: AsyncLLMEngine, prompt_ids: list[list[int]]
) -> None:
    num_free = async_engine.engine.engine_stats().num_free_kv_blocks

    async def main() -> None:
        params = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
        stream = async_engine.generate_stream(EngineRequest("cancel-me", prompt_ids[0], params, "adapter-01"))
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert not async_engine.engine.has_unfinished_requests()
    assert async_engine.engine.engine_stats().num_free_kv_blocks == num_free


def test_adapter_management_while_streaming(
    async_engine: AsyncLLMEngine, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    async def main() -> None:
        # far more tokens than the checks below take to run on any device; the request ends by abort
        params = SamplingParams(max_tokens=900, temperature=0, ignore_eos=True)
        stream = async_engine.generate_stream(EngineRequest("busy", prompt_ids[0], params, "adapter-02"))
        await stream.__anext__()
        with pytest.raises(AdapterInUseError):
            await async_engine.unload_adapter("adapter-02")
        await async_engine.unload_adapter("adapter-01")
        await async_engine.load_adapter("fresh", adapter_dirs["adapter-01"])
        assert not (await stream.__anext__()).is_finished  # still running: the unload above was refused
        await async_engine.abort("busy")
        outs = [o async for o in stream]
        assert outs[-1].is_finished and outs[-1].finish_reason == "abort"
        await async_engine.unload_adapter("adapter-02")

    asyncio.run(main())
    assert "fresh" in async_engine.loaded_adapters() and "adapter-02" not in async_engine.loaded_adapters()


def test_abort_ends_the_stream_with_abort(async_engine: AsyncLLMEngine, prompt_ids: list[list[int]]) -> None:
    async def main() -> str | None:
        params = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
        last = None
        async for out in async_engine.generate_stream(EngineRequest("a", prompt_ids[1], params)):
            if last is None:
                await async_engine.abort("a")
            last = out
        return last.finish_reason if last else None

    assert asyncio.run(main()) == "abort"


def test_the_tenant_and_its_fair_share_weight_reach_the_engines_add_request(
    async_engine: AsyncLLMEngine, prompt_ids: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = async_engine.engine
    seen: list[tuple[str | None, float]] = []
    add_request = engine.add_request

    def recording_add_request(request: EngineRequest) -> Any:
        seen.append((request.tenant_id, request.tenant_weight))
        return add_request(request)

    monkeypatch.setattr(engine, "add_request", recording_add_request)

    async def main() -> None:
        stream = async_engine.generate_stream(
            EngineRequest("w1", prompt_ids[0], GREEDY, tenant_id="t1", tenant_weight=2.5)
        )
        async for _ in stream:
            pass

    asyncio.run(main())
    assert seen == [("t1", 2.5)]
