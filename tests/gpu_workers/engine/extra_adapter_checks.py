"""Checks shared by the tests of adapters with parts beyond plain LoRA (DoRA, embed_tokens / lm_head LoRA): the
engine's greedy tokens against transformers + peft alone and in a mixed batch of 16, on one LoRA form, and with
the CPU-assisted prefill on the adapter's host copy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.layers import lora_forms
from gpu_workers.engine.layers.lora_forms import is_lora_form_usable
from gpu_workers.engine.layers.triton_lora import TRITON_LORA_FORMS
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams
from tests.gpu_workers.conftest import HfOracle
from tests.gpu_workers.engine.triton_interpreter import KERNEL_DEVICE

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
CPU = torch.device("cpu")
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def engine_with(make_engine: Callable[..., LLMEngine], dirs: dict[str, Path], **kwargs: Any) -> LLMEngine:
    """An engine of `make_engine(**kwargs)` with every adapter of `dirs` loaded under its name."""
    engine = make_engine(**kwargs)
    for name, path in dirs.items():
        engine.load_adapter(name, path)
    return engine


def mixed_rows(adapter_dirs: dict[str, Path], extra_dirs: dict[str, Path]) -> list[str | None]:
    """16 rows: the adapters under test and the plain LoRA ones side by side, and base rows."""
    names: list[str | None] = [*extra_dirs, *adapter_dirs, None]
    return [names[i % len(names)] for i in range(16)]


def assert_peft_tokens(
    engine: LLMEngine, oracle: HfOracle, prompt_ids: list[list[int]], adapters: list[str | None], why: str
) -> None:
    """Each row's greedy tokens equal peft's for its adapter."""
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    outs = engine.generate(prompts, GREEDY, adapter_ids=adapters)
    for prompt, adapter, out in zip(prompts, adapters, outs):
        assert out.token_ids == oracle.greedy(prompt, adapter, GREEDY.max_tokens), (why, adapter)


def forms_served_on(
    form: str,
    make_engine: Callable[..., LLMEngine],
    extra_dirs: dict[str, Path],
    adapter_dirs: dict[str, Path],
    oracle: HfOracle,
    prompt_ids: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[type, ...]]:
    """On decode LoRA form `form` (skipped where it cannot run; Triton under the interpreter): peft's tokens for
    each adapter of `extra_dirs` alone and for a mixed batch of 16; returns the form kinds of every batch served."""
    device = "cpu"
    if form in TRITON_LORA_FORMS:
        if KERNEL_DEVICE is None:
            pytest.skip("no Triton kernel device (interpreter or GPU)")
        monkeypatch.setattr(lora_forms, "triton_unusable_reason", lambda device, dtype: None)
        device = KERNEL_DEVICE.type
    elif not is_lora_form_usable(form, CPU, torch.float32):
        pytest.skip(f"{form} cannot run here")
    engine = engine_with(make_engine, extra_dirs, device=device, decode_lora_form=form)
    assert engine.runner.kernel_plan.decode_lora == form
    served: list[tuple[type, ...]] = []
    batch = engine.runner.lora_forms.batch

    def recording_batch(*args: Any) -> Any:
        lora = batch(*args)
        served.append(tuple(type(f) for f in lora.forms))
        return lora

    monkeypatch.setattr(engine.runner.lora_forms, "batch", recording_batch)
    for name in extra_dirs:
        assert_peft_tokens(engine, oracle, prompt_ids, [name], f"{form}: alone")
    assert_peft_tokens(engine, oracle, prompt_ids, mixed_rows(adapter_dirs, extra_dirs), f"{form}: mixed 16")
    return served


def assert_host_copy_prefill_gives_peft_tokens(
    make_engine: Callable[..., LLMEngine], name: str, path: Path, oracle: HfOracle, prompt: list[int]
) -> None:
    """A cold adapter (a link slow enough that its copy takes ~0.5 s) prefills its first layer on its host copy
    and still gives peft's tokens."""
    probe = make_engine()
    probe.load_adapter(name, path)
    num_bytes = probe.runner.adapters[name].num_bytes
    engine = make_engine(adapter_link_gbps=num_bytes / 0.5 / 1e9)
    engine.register_adapter("cold", path)
    engine.runner.host_switch_layer = 1
    [out] = engine.generate([prompt], GREEDY, adapter_ids=["cold"])
    assert out.token_ids == oracle.greedy(prompt, name, GREEDY.max_tokens)
    assert engine.engine_stats().num_cpu_assisted_prefills == 1
