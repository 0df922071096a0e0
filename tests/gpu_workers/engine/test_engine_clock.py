"""The engine's one injected clock: request times and the residency's ages all come from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.outputs import RequestOutput
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams


@dataclass
class ManualClock:
    """The engine's clock, set by the test."""

    now: float

    def __call__(self) -> float:
        return self.now


def test_engine_stamps_times_and_last_use_from_its_clock(
    base_model_dir: Path, adapter_dirs: dict[str, Path]
) -> None:
    clock = ManualClock(now=50.0)
    engine = LLMEngine(
        EngineConfig(model_path=base_model_dir, dtype="float32", num_kv_blocks=64), clock=clock
    )
    assert engine.scheduler.clock is clock and engine.residency.clock is clock
    engine.load_adapter("adapter-01", adapter_dirs["adapter-01"])
    adapter = engine.residency.get("adapter-01")
    assert adapter is not None and adapter.last_use == 50.0

    clock.now = 100.0
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest("timed", [1, 5, 9, 13], params, "adapter-01"))
    engine.add_request(
        EngineRequest("aborted", [1, 6, 10], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    )
    assert adapter.last_use == 100.0  # the request's arrival is an access
    outputs: list[RequestOutput] = []
    for step_time in (200.0, 300.0, 400.0):
        clock.now = step_time
        outputs.extend(o for o in engine.step() if o.request_id == "timed")
        assert adapter.last_use <= step_time
    assert adapter.last_use > 100.0  # used again while it ran
    clock.now = 450.0
    assert engine.abort("aborted")

    seq_outputs = [o for o in outputs if o.new_token_ids]
    assert [o.num_output_tokens for o in seq_outputs] == [1, 2, 3]
    last = outputs[-1]
    assert last.is_finished and last.finish_reason == "length"
    assert last.arrival_time == 100.0
    assert last.first_scheduled_time == 200.0
    assert last.first_token_time == 200.0
    assert last.finish_time == 400.0
    [aborted] = engine.step()
    assert aborted.request_id == "aborted" and aborted.finish_reason == "abort"
    assert aborted.arrival_time == 100.0 and aborted.finish_time == 450.0


def test_engine_keeps_a_given_arrival_time(base_model_dir: Path) -> None:
    clock = ManualClock(now=7.0)
    engine = LLMEngine(
        EngineConfig(model_path=base_model_dir, dtype="float32", num_kv_blocks=32), clock=clock
    )
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.add_request(EngineRequest("given", [1, 2, 3], params, arrival_time=3.5))
    clock.now = 8.0
    [out] = engine.step()
    assert out.arrival_time == 3.5 and out.first_scheduled_time == 8.0 and out.finish_time == 8.0
