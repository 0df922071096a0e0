"""The kernel tuner: picks the fastest candidate (the simplest on a near tie), caches the choice per machine,
dtype and shape, survives a corrupt cache, and a forced setting wins; the engine's prefill GEMM path follows it."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.kernel_tuner import KernelTuner, pick_candidate
from gpu_workers.engine.layers.linear import (
    PREFILL_GEMM_FORMS,
    PREFILL_GEMM_OP,
    can_pack_linear,
    prefill_gemm_candidates,
)
from gpu_workers.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def make_cpu_engine(make_engine: Callable[..., LLMEngine]) -> Callable[..., LLMEngine]:
    """CPU engines: the prefill GEMM forms the tuner measures are CPU kernels (on a CUDA machine the
    engine's device would be the GPU)."""
    return functools.partial(make_engine, device="cpu")


MACHINE = {"cpu": "Test CPU", "flags": "abc", "torch": "2.0", "threads": "2"}
SHAPE = (512, 64, 128)


class FakeClock:
    """A clock that only moves when a fake candidate runs (by that candidate's cost)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def candidate(self, cost: float, calls: list[str], name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            self.now += cost

        return run


def _tuner(path: Path, clock: FakeClock | None = None, **machine: str) -> KernelTuner:
    return KernelTuner(path, clock=clock or FakeClock(), machine={**MACHINE, **machine})


def _candidates(
    clock: FakeClock, costs: dict[str, float], calls: list[str]
) -> tuple[list[str], Callable[[], dict[str, Callable[[], None]]]]:
    """(names, build) for KernelTuner.choose."""
    candidates = {name: clock.candidate(cost, calls, name) for name, cost in costs.items()}
    return list(candidates), lambda: candidates


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        ({"simple": 2.0, "fancy": 1.0}, "fancy"),  # clearly faster
        ({"simple": 1.0, "fancy": 2.0}, "simple"),
        ({"simple": 1.125, "fancy": 1.0}, "simple"),  # near tie (within 1.15x): the simpler one
    ],
)
def test_picks_the_faster_candidate_and_the_simpler_on_a_near_tie(
    tmp_path: Path, costs: dict[str, float], expected: str
) -> None:
    clock, calls = FakeClock(), []
    tuner = _tuner(tmp_path / "choices.json", clock)
    choice = tuner.choose("op", *_candidates(clock, costs, calls), SHAPE, torch.bfloat16)
    assert (choice.op, choice.choice, choice.source) == ("op", expected, "measured")
    assert choice.timings == costs
    assert calls == ["simple", "fancy"] * (1 + tuner.num_repeats)  # one warm-up, then interleaved
    assert tuner.choices == {"op": choice}


def test_pick_candidate_is_best_of_with_margin() -> None:
    assert pick_candidate({"a": 1.15, "b": 1.0}) == "a"
    assert pick_candidate({"a": 1.16, "b": 1.0}) == "b"
    assert pick_candidate({"a": 3.0, "b": 2.0, "c": 1.0}, margin=1.0) == "c"
    with pytest.raises(ValueError):
        pick_candidate({})


def test_a_cached_choice_is_never_measured_again(tmp_path: Path) -> None:
    """A second start with the same key calls no candidate (a busy machine cannot flip the choice); another
    thread count, torch version, CPU, flags, instruction-set cap, shape, dtype or candidate list measures
    again."""
    path, clock = tmp_path / "choices.json", FakeClock()
    first: list[str] = []
    _tuner(path, clock).choose(
        "op", *_candidates(clock, {"simple": 2.0, "fancy": 1.0}, first), SHAPE, torch.bfloat16
    )
    assert first

    again: list[str] = []
    tuner = _tuner(path, clock)
    choice = tuner.choose(
        "op", *_candidates(clock, {"simple": 1.0, "fancy": 9.0}, again), SHAPE, torch.bfloat16
    )
    assert again == [] and (choice.choice, choice.source, choice.timings) == ("fancy", "cached", {})
    assert tuner.seconds == 0.0

    for machine, shape, dtype in (
        ({"threads": "4"}, SHAPE, torch.bfloat16),
        ({"torch": "2.1"}, SHAPE, torch.bfloat16),
        ({"cpu": "Other CPU"}, SHAPE, torch.bfloat16),
        ({"flags": "another-digest"}, SHAPE, torch.bfloat16),  # same model name, other flags (AMD EPYC kinds)
        ({"isa": "AVX2/AVX2"}, SHAPE, torch.bfloat16),
        ({}, (256, 64, 128), torch.bfloat16),
        ({}, SHAPE, torch.float16),
    ):
        calls: list[str] = []
        choice = _tuner(path, clock, **machine).choose(
            "op", *_candidates(clock, {"simple": 1.0, "fancy": 9.0}, calls), shape, dtype
        )
        assert calls and (choice.choice, choice.source) == ("simple", "measured")
    calls = []
    choice = _tuner(path, clock).choose(
        "op", *_candidates(clock, {"simple": 1.0, "fancy": 9.0, "newer": 0.5}, calls), SHAPE, torch.bfloat16
    )
    assert calls and (choice.choice, choice.source) == ("newer", "measured")  # a new candidate is measured
    entries = json.loads(path.read_text())["choices"]
    assert len(entries) == 9  # every key kept side by side


@pytest.mark.parametrize("content", ["{not json", '{"version": 1, "choices": []}', '["x"]', ""])
def test_a_corrupt_cache_is_ignored_with_one_warning_and_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    path, clock = tmp_path / "choices.json", FakeClock()
    path.write_text(content)
    tuner = _tuner(path, clock)
    with caplog.at_level(logging.WARNING, logger="gpu_workers.engine.kernel_tuner"):
        for op in ("op", "other_op"):
            calls: list[str] = []
            choice = tuner.choose(
                op, *_candidates(clock, {"simple": 2.0, "fancy": 1.0}, calls), SHAPE, torch.bfloat16
            )
            assert calls and choice.choice == "fancy"
    warnings = [r for r in caplog.records if r.name == "gpu_workers.engine.kernel_tuner"]
    assert len(warnings) == 1 and "kernel choices cache" in warnings[0].getMessage()
    assert len(json.loads(path.read_text())["choices"]) == 2  # rewritten, valid
    assert [p.name for p in tmp_path.iterdir()] == ["choices.json"]  # no temporary file left behind

    calls = []
    cached = _tuner(path, clock).choose(
        "op", *_candidates(clock, {"simple": 2.0, "fancy": 1.0}, calls), SHAPE, torch.bfloat16
    )
    assert calls == [] and cached.source == "cached"


def test_a_forced_choice_wins_without_measuring(tmp_path: Path) -> None:
    path, clock, calls = tmp_path / "choices.json", FakeClock(), []
    tuner = _tuner(path, clock)
    choice = tuner.choose(
        "op", *_candidates(clock, {"simple": 1.0, "fancy": 9.0}, calls), SHAPE, torch.bfloat16, forced="fancy"
    )
    assert (choice.choice, choice.source) == ("fancy", "forced") and calls == [] and not path.exists()
    assert tuner.seconds == 0.0
    with pytest.raises(ValueError, match="not one of"):
        tuner.choose("op", *_candidates(clock, {"simple": 1.0}, calls), SHAPE, torch.bfloat16, forced="nope")


def test_an_unwritable_cache_keeps_the_choice_for_this_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    clock, calls = FakeClock(), []
    with caplog.at_level(logging.WARNING, logger="gpu_workers.engine.kernel_tuner"):
        choice = _tuner(blocker / "choices.json", clock).choose(
            "op", *_candidates(clock, {"simple": 2.0, "fancy": 1.0}, calls), SHAPE, torch.bfloat16
        )
    assert choice.choice == "fancy" and "cannot write" in caplog.text


needs_bf16_packing = pytest.mark.skipif(
    not can_pack_linear(torch.bfloat16, torch.device("cpu")),
    reason="oneDNN bf16 packed linear unavailable here",
)


@needs_bf16_packing
def test_prefill_gemm_candidates_compute_the_same_product() -> None:
    """Every candidate is the same product (to bf16 rounding): the choice changes speed, never results."""
    outs = {
        name: fn()
        for name, fn in prefill_gemm_candidates(PREFILL_GEMM_FORMS, 96, 64, torch.bfloat16, 300).items()
    }
    assert list(outs) == ["packed", "fp32_upcast", "plain"]  # the simplest first
    wide = outs["fp32_upcast"].double()
    for name in ("packed", "plain"):
        out = outs[name].double()
        assert out.shape == wide.shape == (300, 96)
        assert ((out - wide).abs() <= wide.abs() * 2**-7 + 1e-6).all(), name


@needs_bf16_packing
@pytest.mark.parametrize(
    ("fastest", "wide"), [("packed", None), ("fp32_upcast", torch.float32), ("plain", torch.bfloat16)]
)
def test_the_engine_prefill_gemm_follows_the_tuner(
    make_cpu_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fastest: str,
    wide: torch.dtype | None,
) -> None:
    """Unforced, the engine's prefill GEMM path is the tuner's measured choice on the model's MLP shape (not the
    CPU's flags), shown in the engine stats; a second engine on the same cache measures nothing."""
    from gpu_workers.engine import kernel_tuner

    measured: list[list[str]] = []

    def fake_measure(self: KernelTuner, candidates: dict[str, Any]) -> dict[str, float]:
        measured.append(list(candidates))
        return {name: (1.0 if name in (fastest, "sdpa", "segmented") else 3.0) for name in candidates}

    monkeypatch.setattr(kernel_tuner.KernelTuner, "measure", fake_measure)
    path = tmp_path / "choices.json"
    engine = make_cpu_engine(dtype="bfloat16", packed_linears=True, kernel_choices_path=path)
    assert engine.runner.wide_gemm_dtype == wide
    assert measured[0] == ["packed", "fp32_upcast", "plain"]
    stats = engine.runner_stats()
    assert stats.kernel_choices[PREFILL_GEMM_OP] == fastest
    assert stats.kernel_choice_sources[PREFILL_GEMM_OP] == "measured"
    assert stats.fp32_prefill_gemms is (fastest == "fp32_upcast")
    keys = [json.loads(k) for k in json.loads(path.read_text())["choices"]]
    args = engine.runner.args
    assert [k["shape"] for k in keys if k["op"] == PREFILL_GEMM_OP] == [
        [512, args.hidden_size, args.intermediate_size]
    ]

    num_measured = len(measured)
    cached = make_cpu_engine(dtype="bfloat16", packed_linears=True, kernel_choices_path=path)
    assert len(measured) == num_measured and cached.runner.wide_gemm_dtype == wide
    assert cached.runner_stats().kernel_tuner_s == 0.0


@needs_bf16_packing
@pytest.mark.parametrize(("forced", "wide"), [(True, torch.float32), (False, None)])
def test_the_fp32_prefill_gemms_setting_wins_without_measuring(
    make_cpu_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    forced: bool,
    wide: torch.dtype | None,
) -> None:
    from gpu_workers.engine import kernel_tuner

    def no_measure(self: KernelTuner, candidates: dict[str, Any]) -> dict[str, float]:
        raise AssertionError("a forced choice must not be measured")

    monkeypatch.setattr(kernel_tuner.KernelTuner, "measure", no_measure)
    path = tmp_path / "choices.json"
    engine = make_cpu_engine(
        dtype="bfloat16",
        packed_linears=True,
        fp32_prefill_gemms=forced,
        kernel_choices_path=path,
        decode_attention="sdpa",
        decode_lora_form="segmented",
    )
    assert engine.runner.wide_gemm_dtype == wide
    assert engine.runner.kernel_tuner.choices[PREFILL_GEMM_OP].source == "forced"
    assert not path.exists()
