"""Property: no adapter that passes validation can make the engine compute non-finite logits for another
request, or change them at all: a batch neighbour's logits stay finite and equal to its solo run.

Adapters are generated over ranks, alphas, rsLoRA, target modules, file dtypes and value magnitudes from
tiny to 3e38 (most beyond the bounds: those must be refused), including adapters scaled to just under the
update bound relative to the base weights. The ones that validate run in the tiny fp32 engine next to a
normal adapter, in the stacked and the per-segment multi-LoRA forms.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_workers.engine.llm_engine import LLMEngine
from registry.validation import (
    DECODER_TARGET_MODULES,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    validate_adapter_dir,
)
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry
from tests.registry.upload_builders import lora_config, lora_tensors, safetensors_bytes, tensor_name

NEIGHBOUR = "adapter-02"  # a normal adapter on every module
NUM_TOKENS = 5
GREEDY = SamplingParams(max_tokens=NUM_TOKENS, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=NUM_TOKENS, temperature=1.0, seed=3, ignore_eos=True)
LIMITS = ValidationLimits()


@pytest.fixture(scope="module")
def engine(make_engine: Any) -> Iterator[LLMEngine]:
    """An fp32 engine that records every sampled row's logits per request id."""
    eng = make_engine()
    eng.recorded = {}
    execute = eng.runner.execute

    def recording_execute(entries: list[BatchEntry], return_logits: bool = False, **kwargs: Any) -> Any:
        tokens, logits = execute(entries, True, **kwargs)
        sampled = [e.seq.request_id for e in entries if e.is_sampling]
        for request_id, row in zip(sampled, logits if logits is not None else []):
            eng.recorded.setdefault(request_id, []).append(row.clone())
        return tokens, (logits if return_logits else None)

    eng.runner.execute = recording_execute
    yield eng


@pytest.fixture(scope="module")
def spec(base_model_dir: Path) -> BaseModelSpec:
    """The tiny base model's spec (validation reads its weight norms)."""
    return BaseModelSpec.from_model_dir(base_model_dir)


@pytest.fixture(scope="module")
def base_norms(base_model_dir: Path) -> dict[tuple[int, str], float]:
    """(layer, module) -> Frobenius norm of the base weight, computed independently of the validator."""
    from safetensors.numpy import load_file

    norms = {}
    for name, weight in load_file(str(base_model_dir / "model.safetensors")).items():
        parts = name.split(".")  # model.layers.<i>.<self_attn|mlp>.<module>.weight
        if len(parts) == 6 and parts[4] in DECODER_TARGET_MODULES:
            norms[(int(parts[2]), parts[4])] = float(np.linalg.norm(weight))
    return norms


Request = tuple[str, SamplingParams, str | None]  # (id, params, adapter)


def _run(engine: LLMEngine, requests: list[Request], prompt: list[int]) -> dict:
    """Run the requests on one prompt; id -> (stacked logits of its sampled steps, finish reason)."""
    engine.recorded.clear()
    for request_id, params, adapter in requests:
        engine.add_request(EngineRequest(request_id, prompt, params, adapter))
    finish: dict[str, str | None] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.is_finished:
                finish[out.request_id] = out.finish_reason
    logits = {rid: torch.stack(engine.recorded.get(rid, [torch.empty(0)])) for rid, *_ in requests}
    return {rid: (logits[rid], finish[rid]) for rid in logits}


@st.composite
def adapters(draw: st.DrawFn, spec_norms: dict) -> tuple[dict, dict[str, np.ndarray], str]:
    """(adapter_config, tensors, safetensors dtype) over the validator's whole input range."""
    rank = draw(st.sampled_from([1, 2, 4, 8, 32]))
    alpha = draw(st.sampled_from([1.0, 8.0, 2.0 * rank, 512.0, 4096.0, 16384.0, 20000.0]))
    use_rslora = draw(st.booleans())
    modules = tuple(draw(st.sets(st.sampled_from(DECODER_TARGET_MODULES), min_size=1)))
    dtype = draw(st.sampled_from(["F32", "BF16", "F16"]))
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    tensors = lora_tensors(rank=rank, modules=modules, seed=int(rng.integers(2**16)))
    mode = draw(st.sampled_from(["magnitude", "edge_of_update_bound", "edge_of_value_bound"]))
    exponent = draw(st.floats(-3.0, 38.5))
    for name in tensors:
        tensors[name] = tensors[name] / np.abs(tensors[name]).max()  # max |value| 1
    for layer in range(2):
        for module in modules:
            a, b = tensor_name(layer, module, "A"), tensor_name(layer, module, "B")
            if mode == "magnitude":
                tensors[a] = (tensors[a] * 10.0**exponent).astype(np.float32)
                tensors[b] = (tensors[b] * 10.0**exponent).astype(np.float32)
            elif mode == "edge_of_value_bound":
                tensors[a] *= LIMITS.max_abs_weight * 0.999
                tensors[b] *= LIMITS.max_abs_weight * 0.999 / scale
            else:  # scale * ||B|| * ||A|| just under max_delta_ratio * ||W||
                target = 0.999 * LIMITS.max_delta_ratio * spec_norms[(layer, module)] / scale
                tensors[b] *= target / (np.linalg.norm(tensors[a]) * np.linalg.norm(tensors[b]))
    config = lora_config(rank, modules, lora_alpha=alpha, use_rslora=use_rslora)
    return config, tensors, dtype


def _write(directory: Path, config: dict, tensors: dict[str, np.ndarray], dtype: str) -> Path:
    (directory / "adapter_config.json").write_text(json.dumps(config))
    (directory / "adapter_model.safetensors").write_bytes(safetensors_bytes(tensors, dtype))
    return directory


@pytest.mark.parametrize("form", ["stacked", "segments"])
def test_no_validated_adapter_changes_another_requests_logits(
    engine: LLMEngine,
    spec: BaseModelSpec,
    base_norms: dict[tuple[int, str], float],
    prompt_ids: list[list[int]],
    form: str,
) -> None:
    engine.runner.lora_forms._use_stacked = lambda segments, n: (form == "stacked") and len(segments) >= 2
    prompt = prompt_ids[1]
    solo = _run(engine, [("solo", GREEDY, NEIGHBOUR)], prompt)["solo"][0]
    num_valid = []

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(adapter=adapters(base_norms))
    def check(adapter: tuple[dict, dict[str, np.ndarray], str]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            directory = _write(Path(tmp), *adapter)
            try:
                validate_adapter_dir(directory, spec, LIMITS)
            except AdapterValidationError:
                return
            num_valid.append(1)
            engine.load_adapter("candidate", directory)
        try:
            got = _run(engine, [("candidate", SAMPLED, "candidate"), ("other", GREEDY, NEIGHBOUR)], prompt)
        finally:
            engine.unload_adapter("candidate")
        other_logits, reason = got["other"]
        assert reason == "length" and torch.isfinite(other_logits).all()
        torch.testing.assert_close(other_logits, solo, rtol=1e-4, atol=1e-4)
        assert got["candidate"][1] == "length"  # and a validated adapter does not overflow its own row

    try:
        check()
    finally:
        del engine.runner.lora_forms._use_stacked
    assert num_valid  # the property was exercised on adapters that validate
