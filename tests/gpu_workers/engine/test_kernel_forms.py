"""Every candidate the kernel tuner may choose gives the same results (gpu_workers/engine/kernel_plan.py): decode
attention forms against an exact reference and peft's tokens, LoRA forms and prefill GEMM forms against peft;
the plan follows the tuner's measurement, a forced setting wins, and a form that cannot run here is refused."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.kernel_tuner import KernelTuner
from gpu_workers.engine.layers.attention import (
    DECODE_ATTENTION_FORMS,
    AttentionMetadata,
    decode_attention,
    is_decode_form_usable,
)
from gpu_workers.engine.layers.linear import can_pack_linear
from gpu_workers.engine.layers.lora_forms import DECODE_LORA_FORMS, is_lora_form_usable
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams


@pytest.fixture(scope="module")
def make_cpu_engine(make_engine: Callable[..., LLMEngine]) -> Callable[..., LLMEngine]:
    """CPU engines: the C kernels, oneDNN packing and the tuner's CPU measurements are CPU
    kernels (on a CUDA machine the engine's device would be the GPU)."""
    return functools.partial(make_engine, device="cpu")


CPU = torch.device("cpu")
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _usable_attention_forms(dtype: torch.dtype) -> list[str]:
    return [f for f in DECODE_ATTENTION_FORMS if is_decode_form_usable(f, CPU, dtype)]


def _decode_case(dtype: torch.dtype, lens: list[int], num_extra_rows: int) -> tuple[Any, ...]:
    """A page pool of random K/V with a neighbour's huge values in the unused slots of every page, decodes
    of lengths `lens` over shuffled pages, `num_extra_rows` prefill rows before them in the batch."""
    generator = torch.Generator().manual_seed(3)
    block_size, num_heads, num_kv_heads, head_dim = 4, 6, 2, 8
    max_blocks = -(-max(lens) // block_size)
    num_pages = len(lens) * max_blocks + 1
    k_cache = torch.randn(num_pages * block_size, num_kv_heads, head_dim, generator=generator) * 60_000
    v_cache = torch.randn(num_pages * block_size, num_kv_heads, head_dim, generator=generator) * 60_000
    pages = torch.randperm(num_pages, generator=generator)[: len(lens) * max_blocks].view(
        len(lens), max_blocks
    )
    for i, n in enumerate(lens):  # real positions hold modest values; the rest of the pages stay huge
        for p in range(n):
            slot = pages[i, p // block_size] * block_size + p % block_size
            k_cache[slot] = torch.randn(num_kv_heads, head_dim, generator=generator)
            v_cache[slot] = torch.randn(num_kv_heads, head_dim, generator=generator)
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.long)
    for i, n in enumerate(
        lens
    ):  # a shorter sequence's table is padded with page 0 (another's), as the runner does
        used = -(-n // block_size)
        tables[i, :used] = pages[i, :used]
    q = torch.randn(num_extra_rows + len(lens), num_heads, head_dim, generator=generator)
    lens_t = torch.tensor(lens, dtype=torch.long)
    is_real = torch.arange(max_blocks * block_size).unsqueeze(0) < lens_t.unsqueeze(1)
    pad_rows = (~is_real).view(-1).nonzero().squeeze(1)
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        prefills=(),
        decode_token_idx=torch.arange(num_extra_rows, num_extra_rows + len(lens)),
        decode_blocks=tables,
        decode_mask=is_real[:, None, None, :] if pad_rows.numel() else None,
        decode_pad_rows=pad_rows if pad_rows.numel() else None,
        is_all_decode=num_extra_rows == 0,
        block_size=block_size,
        decode_lens=lens_t,
    )
    expected = torch.empty(len(lens), num_heads, head_dim, dtype=torch.float64)
    group = num_heads // num_kv_heads
    for i, n in enumerate(lens):
        slots = torch.tensor([pages[i, p // block_size] * block_size + p % block_size for p in range(n)])
        k, v = k_cache[slots].double(), v_cache[slots].double()  # [n, Hkv, D]
        for h in range(num_heads):
            scores = k[:, h // group] @ q[num_extra_rows + i, h].double() * head_dim**-0.5
            expected[i, h] = torch.softmax(scores, 0) @ v[:, h // group]
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), meta, expected, head_dim**-0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("lens", "num_extra_rows"), [([5, 12, 1, 9], 0), ([16, 3], 2), ([7], 0)])
def test_every_decode_attention_form_is_exact_attention(
    dtype: torch.dtype, lens: list[int], num_extra_rows: int
) -> None:
    """Each form is softmax(q K^T) V over exactly the sequence's own positions (to the dtype's rounding):
    never a padding position, a neighbour's page or a stale slot, whatever they hold."""
    q, k_cache, v_cache, meta, expected, scale = _decode_case(dtype, lens, num_extra_rows)
    tolerance = 2e-5 if dtype == torch.float32 else 0.05
    for form in _usable_attention_forms(dtype):
        out = decode_attention(q, k_cache, v_cache, replace(meta, decode_form=form), scale)
        assert out.shape == expected.shape and out.dtype == dtype
        assert torch.isfinite(out).all(), form
        err = (out.double() - expected).abs().max().item()
        assert err <= tolerance * (1 + expected.abs().max().item()), (form, err)


@pytest.mark.parametrize("form", DECODE_ATTENTION_FORMS)
def test_every_decode_attention_form_gives_peft_tokens(
    make_cpu_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict, form: str
) -> None:
    """An engine forced to each form decodes a mixed batch (base and every adapter, prompts of different
    lengths, so decodes carry padding) to peft's greedy tokens."""
    if not is_decode_form_usable(form, CPU, torch.float32):
        why = {
            "sdpa_fp32": "the fp32 model's sdpa; see the bf16 test below",
            "triton": "CUDA only; test_triton_attention.py runs it under the interpreter",
        }
        pytest.skip(f"{form} cannot run here ({why.get(form, 'not built on this machine')})")
    engine = make_cpu_engine(decode_attention=form)
    assert engine.runner.kernel_plan.decode_attention == form
    adapters: list[str | None] = [None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    for prompt, adapter, out in zip(
        prompts, adapters, engine.generate(prompts, GREEDY, adapter_ids=adapters)
    ):
        assert out.token_ids == hf_oracle.greedy(prompt, adapter, 8), (form, adapter)


def test_bf16_decode_attention_forms_agree(
    make_cpu_engine: Any, prompt_ids: list[list[int]], adapter_dirs: dict
) -> None:
    """In bf16 (where sdpa_fp32 differs from sdpa) every form decodes the mixed batch to the same first tokens
    (later ones may flip on bf16 ties)."""
    adapters: list[str | None] = [None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    tokens = {}
    for form in _usable_attention_forms(torch.bfloat16):
        engine = make_cpu_engine(dtype="bfloat16", decode_attention=form)
        tokens[form] = [out.token_ids[:4] for out in engine.generate(prompts, GREEDY, adapter_ids=adapters)]
    assert "sdpa_fp32" in tokens
    assert all(t == tokens["sdpa_fp32"] for t in tokens.values()), tokens


@pytest.mark.parametrize("form", DECODE_LORA_FORMS)
def test_every_decode_lora_form_gives_peft_tokens(
    make_cpu_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict, form: str
) -> None:
    """An engine forced to each LoRA form decodes a batch of every adapter twice (and the base) to peft's
    greedy tokens."""
    if not is_lora_form_usable(form, CPU, torch.float32):
        pytest.skip(f"{form} cannot run here")
    engine = make_cpu_engine(decode_lora_form=form)
    assert engine.runner.kernel_plan.decode_lora == form
    adapters: list[str | None] = [*adapter_dirs, None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    for prompt, adapter, out in zip(
        prompts, adapters, engine.generate(prompts, GREEDY, adapter_ids=adapters)
    ):
        assert out.token_ids == hf_oracle.greedy(prompt, adapter, 8), (form, adapter)
    if form == "segmented":
        assert engine.runner_stats().num_lora_stack_builds == 0 and not engine.runner.lora_forms.kernel_sets


needs_bf16_packing = pytest.mark.skipif(
    not can_pack_linear(torch.bfloat16, CPU), reason="oneDNN bf16 packed linear unavailable here"
)


@needs_bf16_packing
@pytest.mark.parametrize("form", ["packed", "fp32_upcast", "plain"])
def test_every_prefill_gemm_form_matches_peft(make_cpu_engine: Any, hf_oracle: Any, form: str) -> None:
    """A prompt long enough for the prefill GEMM path gives peft's logits within bf16 noise in each form."""
    from tests.gpu_workers.engine.test_fast_paths import _prefill_logits

    prompt = [1] + [7 + (i * 37) % 500 for i in range(300)]
    engine = make_cpu_engine(dtype="bfloat16", packed_linears=True, prefill_gemm=form)
    assert engine.runner.kernel_plan.prefill_gemm == form
    assert engine.runner_stats().kernel_choices["prefill_gemm"] == form
    for adapter in (None, "adapter-02"):
        expected = hf_oracle.logits(prompt, adapter)
        logits = _prefill_logits(engine, prompt, adapter)
        assert (logits - expected).abs().max() < 0.05 * expected.abs().max() + 0.05


@pytest.mark.parametrize(
    ("op", "forms"), [("decode_attention", DECODE_ATTENTION_FORMS), ("decode_lora", DECODE_LORA_FORMS)]
)
def test_the_plan_follows_the_measurement_and_a_second_start_measures_nothing(
    make_cpu_engine: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, op: str, forms: tuple[str, ...]
) -> None:
    """Unforced, each op's form is the tuner's fastest (never the CPU's flags), measured on the model's shape,
    shown in the engine stats; another engine on the same cache measures nothing."""
    is_usable = is_decode_form_usable if op == "decode_attention" else is_lora_form_usable
    usable = [f for f in forms if is_usable(f, CPU, torch.float32)]
    fastest = usable[-1]
    measured: dict[str, list[str]] = {}

    def fake_measure(self: KernelTuner, candidates: dict[str, Any]) -> dict[str, float]:
        for fn in candidates.values():
            fn()  # every candidate runs on the model's shapes
        measured.setdefault(",".join(candidates), list(candidates))
        return {name: (1.0 if name == fastest else 3.0) for name in candidates}

    monkeypatch.setattr(KernelTuner, "measure", fake_measure)
    path = tmp_path / "choices.json"
    engine = make_cpu_engine(kernel_choices_path=path)
    assert getattr(engine.runner.kernel_plan, op) == fastest
    assert list(usable) in measured.values()
    stats = engine.runner_stats()
    assert stats.kernel_choices[op] == fastest and stats.kernel_choice_sources[op] == "measured"
    keys = [json.loads(k) for k in json.loads(path.read_text())["choices"]]
    assert any(k["op"] == op and k["dtype"] == "float32" for k in keys)
    calls_before = len(measured)
    again = make_cpu_engine(kernel_choices_path=path)
    assert getattr(again.runner.kernel_plan, op) == fastest
    assert again.runner_stats().kernel_tuner_s == 0.0 and len(measured) == calls_before
    assert again.runner_stats().kernel_choice_sources[op] == "cached"


def test_forced_forms_win_without_measuring(
    make_cpu_engine: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_measure(self: KernelTuner, candidates: dict[str, Any]) -> dict[str, float]:
        raise AssertionError("a forced choice must not be measured")

    monkeypatch.setattr(KernelTuner, "measure", no_measure)
    path = tmp_path / "choices.json"
    engine = make_cpu_engine(
        decode_attention="grouped_matmul",
        decode_lora_form="segmented",
        linear_weights="plain",
        kernel_choices_path=path,
    )
    plan = engine.runner.kernel_plan
    assert (plan.decode_attention, plan.decode_lora, plan.linear_weights) == (
        "grouped_matmul",
        "segmented",
        "plain",
    )
    assert not engine.runner.use_packed_linears
    assert engine.runner_stats().kernel_choice_sources == {
        "decode_attention": "forced",
        "decode_lora": "forced",
        "linear_weights": "forced",
        "decode_step": "forced",  # the fixture's eager decode step
    }
    assert not path.exists()


def test_a_form_that_is_not_one_is_refused(base_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="decode_attention must be one of"):
        EngineConfig(model_path=base_model_dir, decode_attention="flash")
    with pytest.raises(ValueError, match="decode_lora_form must be one of"):
        EngineConfig(model_path=base_model_dir, decode_lora_form="punica")
    with pytest.raises(ValueError, match="linear_weights must be one of"):
        EngineConfig(model_path=base_model_dir, linear_weights="blocked")


def test_a_forced_form_that_cannot_run_here_is_refused(
    make_cpu_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the C kernels (no compiler), forcing them fails at start with the usable forms listed."""
    from gpu_workers.engine import kernel_plan
    from gpu_workers.engine.layers import attention, lora_forms

    monkeypatch.setattr(attention, "load_cpu_kernels", lambda: None)
    monkeypatch.setattr(lora_forms, "is_kernel_usable", lambda device, dtype: False)
    assert kernel_plan  # the plan reads both through these modules
    with pytest.raises(ValueError, match=r"decode_attention 'c_kernel' cannot run here; usable: \['sdpa'"):
        make_cpu_engine(decode_attention="c_kernel")
    with pytest.raises(ValueError, match=r"decode_lora_form 'kernel' cannot run here"):
        make_cpu_engine(decode_lora_form="kernel")
