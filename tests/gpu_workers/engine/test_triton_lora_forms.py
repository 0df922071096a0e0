"""The Triton LoRA forms in the engine: candidates of the kernel tuner on CUDA only (elsewhere skipped, with why,
in the choice and the engine stats), and an engine forced onto them gives peft's tokens (under Triton's
interpreter on CPU here: the forms' wiring, not their speed)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine import kernel_plan
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.kernel_tuner import KernelChoice, KernelTuner, accelerator_fingerprint
from gpu_workers.engine.layers import lora_forms, triton_lora
from gpu_workers.engine.layers.lora_forms import DECODE_LORA_OP, lora_form_unusable_reason
from gpu_workers.engine.layers.triton_lora import TRITON_LORA_FORMS, TritonStep, triton_unusable_reason
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.loader import read_hf_config
from gpu_workers.engine.models.llama import ModelArgs
from scheduler.core.sampling import SamplingParams
from tests.gpu_workers.engine.triton_interpreter import KERNEL_DEVICE, needs_triton_kernels

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
GREEDY = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)  # a prefill and two decode steps


@pytest.fixture(scope="module")
def make_cpu_engine(make_engine: Callable[..., LLMEngine]) -> Callable[..., LLMEngine]:
    """CPU engines (the tuner's choices below are about a CPU worker)."""
    return functools.partial(make_engine, device="cpu")


def test_triton_forms_are_no_candidates_on_cpu_and_the_choice_says_why(
    make_cpu_engine: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A CPU engine measures only the CPU forms; sgmv and bgmv are skipped with the reason (CUDA only) in the
    tuner's choice and in the engine stats."""
    measured: list[list[str]] = []

    def fake_measure(self: KernelTuner, candidates: dict[str, Any]) -> dict[str, float]:
        measured.append(list(candidates))
        return {name: 1.0 for name in candidates}

    monkeypatch.setattr(KernelTuner, "measure", fake_measure)
    engine = make_cpu_engine(kernel_choices_path=tmp_path / "choices.json")
    choice = engine.runner.kernel_tuner.choices[DECODE_LORA_OP]
    assert not set(TRITON_LORA_FORMS) & {name for names in measured for name in names}
    for form in TRITON_LORA_FORMS:
        assert "CUDA" in choice.skipped[form] and "interpreter is a test tool" in choice.skipped[form]
    assert engine.runner_stats().kernel_choice_skipped[DECODE_LORA_OP] == choice.skipped


def test_why_the_triton_forms_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reason names what to change: the device, the dtype, a missing triton."""
    assert "CUDA" in str(triton_unusable_reason(CPU, torch.bfloat16))
    assert "float64" in str(triton_unusable_reason(CUDA, torch.float64))
    monkeypatch.setattr(triton_lora.importlib.util, "find_spec", lambda name: None)
    assert triton_unusable_reason(CUDA, torch.bfloat16) == "triton is not installed"
    assert lora_form_unusable_reason("sgmv", CUDA, torch.bfloat16) == "triton is not installed"
    assert lora_form_unusable_reason("segmented", CUDA, torch.bfloat16) is None
    assert "CPU" in str(lora_form_unusable_reason("kernel", CUDA, torch.bfloat16))


def test_on_cuda_every_usable_form_is_measured_and_a_gpu_keys_its_choice(
    base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the Triton forms can run (CUDA with triton), the tuner measures them beside segmented and stacked
    (the CPU kernel skipped, with why); the cache key of a GPU's choice names the GPU."""
    monkeypatch.setattr(lora_forms, "triton_unusable_reason", lambda device, dtype: None)
    monkeypatch.setattr(lora_forms, "is_kernel_usable", lambda device, dtype: device.type == "cpu")
    names_measured: list[tuple[str, ...]] = []

    def choose(op: str, names: tuple[str, ...], *args: Any, **kwargs: Any) -> Any:
        names_measured.append(tuple(names))
        return KernelChoice(op, names[-1], skipped=dict(kwargs["skipped"]))

    tuner = KernelTuner(machine={"cpu": "test"})
    monkeypatch.setattr(tuner, "choose", choose)
    config = EngineConfig(model_path=base_model_dir, device="cuda")
    args = ModelArgs.from_hf_config(read_hf_config(base_model_dir))
    form = kernel_plan._decode_lora(tuner, config, args, torch.bfloat16, CUDA, False)
    assert names_measured == [("segmented", "stacked", "sgmv", "bgmv")] and form == "bgmv"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    assert accelerator_fingerprint(CUDA)["gpu"] == "NVIDIA H200" and accelerator_fingerprint(CPU) == {}
    # plan_kernels adds the GPU's identity to the tuner's machine; CPU keys are unchanged
    key = lambda device: KernelTuner(machine={"cpu": "test", **accelerator_fingerprint(device)})._key(
        DECODE_LORA_OP, ("segmented",), (1,), torch.bfloat16
    )
    assert (
        key(CUDA)
        != key(CPU)
        == KernelTuner(machine={"cpu": "test"})._key(DECODE_LORA_OP, ("segmented",), (1,), torch.bfloat16)
    )


def test_forcing_a_triton_form_where_it_cannot_run_is_refused_with_why(make_cpu_engine: Any) -> None:
    with pytest.raises(ValueError, match=r"decode_lora_form 'sgmv' cannot run here .*CUDA"):
        make_cpu_engine(decode_lora_form="sgmv")


@needs_triton_kernels
@pytest.mark.parametrize("form", TRITON_LORA_FORMS)
def test_an_engine_on_a_triton_form_gives_peft_tokens(
    make_engine: Callable[..., LLMEngine],
    hf_oracle: Any,
    prompt_ids: list[list[int]],
    adapter_dirs: dict,
    monkeypatch: pytest.MonkeyPatch,
    form: str,
) -> None:
    """Every adapter (ranks 2..32, different target modules, one rsLoRA), twice, and the base model in one batch
    decode to peft's greedy tokens through the Triton kernels, which serve every step (prefill and decode)."""
    monkeypatch.setattr(lora_forms, "triton_unusable_reason", lambda device, dtype: None)
    engine = make_engine(device=KERNEL_DEVICE.type if KERNEL_DEVICE else "cpu", decode_lora_form=form)
    assert engine.runner.kernel_plan.decode_lora == form
    served: list[TritonStep] = []
    batch = engine.runner.lora_forms.batch

    def recording_batch(*args: Any) -> Any:
        lora = batch(*args)
        served.extend(f for f in lora.forms if isinstance(f, TritonStep))
        return lora

    monkeypatch.setattr(engine.runner.lora_forms, "batch", recording_batch)
    adapters: list[str | None] = [*adapter_dirs, None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    for prompt, adapter, out in zip(
        prompts, adapters, engine.generate(prompts, GREEDY, adapter_ids=adapters)
    ):
        assert out.token_ids == hf_oracle.greedy(prompt, adapter, GREEDY.max_tokens), (form, adapter)
    if form == "sgmv":
        assert any(step.sgmv for step in served) and not any(step.bgmv for step in served)
    else:  # decode rows (and short prompts) through BGMV
        assert any(step.bgmv for step in served)
