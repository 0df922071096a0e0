"""DoRA adapters (peft use_dora) on the engine: greedy tokens equal transformers + peft in fp32 for a DoRA and an
rsLoRA + DoRA adapter, alone and in a mixed batch of 16 rows beside plain LoRA and base rows, on every LoRA form
the kernel tuner chooses from (the Triton ones under TRITON_INTERPRET=1), in both memory modes and with the
CPU-assisted prefill; the rescale g = m / ||W + s B A|| is computed once at load (layers/dora.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.adapter_layout import layer_numels_for
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.demo_model import generate_adapter
from gpu_workers.engine.layers.dora import MAX_GATHER_ROWS, DoraStep, dora_step
from gpu_workers.engine.layers.linear import MergedLinear, can_pack_linear
from gpu_workers.engine.layers.lora import LoraAdapter, LoraSegment
from gpu_workers.engine.layers.lora_forms import DECODE_LORA_FORMS
from gpu_workers.engine.llm_engine import LLMEngine
from tests.gpu_workers.conftest import HfOracle
from tests.gpu_workers.engine.extra_adapter_checks import (
    ALL_MODULES,
    CPU,
    GREEDY,
    assert_host_copy_prefill_gives_peft_tokens,
    assert_peft_tokens,
    engine_with,
    forms_served_on,
    mixed_rows,
)

# (name, rank, target modules, rsLoRA): a DoRA adapter on every module, an rsLoRA + DoRA one on a subset (the
# columns of modules it does not target keep g = 1)
DORA_PLAN = (
    ("dora-all", 8, ALL_MODULES, False),
    ("dora-rs", 4, ("q_proj", "v_proj", "up_proj", "down_proj"), True),
)


@pytest.fixture(scope="module")
def dora_dirs(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The DoRA adapters of DORA_PLAN, saved by peft with seeded non-trivial weights and magnitudes."""
    root = tmp_path_factory.mktemp("dora")
    return {
        name: generate_adapter(
            base_model_dir, root / name, rank, modules, seed=100 + i, use_rslora=rs, use_dora=True
        )
        for i, (name, rank, modules, rs) in enumerate(DORA_PLAN)
    }


@pytest.fixture(scope="module")
def oracle(base_model_dir: Path, adapter_dirs: dict[str, Path], dora_dirs: dict[str, Path]) -> HfOracle:
    """fp32 transformers + peft with the demo LoRA adapters and the DoRA ones."""
    return HfOracle(base_model_dir, {**adapter_dirs, **dora_dirs}, torch.float32)


def test_dora_changes_tokens_and_differs_from_its_plain_lora(
    make_engine: Any, dora_dirs: dict[str, Path], oracle: HfOracle, prompt_ids: list[list[int]]
) -> None:
    """The oracle is not trivial: the rescale changes the logits against the same adapter without it."""
    engine = engine_with(make_engine, dora_dirs)
    adapter = engine.runner.adapters["dora-all"]
    assert adapter.is_dora and len(adapter.magnitudes) == engine.runner.args.num_layers
    g = adapter.magnitudes[0][0]  # layer 0's g over every projection's columns
    assert g.dtype == torch.float32 and (g - 1).abs().max() > 0.1
    with_dora = oracle.logits(prompt_ids[1], "dora-all")
    assert not torch.allclose(with_dora, oracle.logits(prompt_ids[1], None), atol=1e-3)


@pytest.mark.parametrize("form", DECODE_LORA_FORMS)
def test_every_lora_form_gives_peft_tokens_for_dora_alone_and_in_a_mixed_batch_of_16(
    make_engine: Any,
    dora_dirs: dict[str, Path],
    adapter_dirs: dict[str, Path],
    oracle: HfOracle,
    prompt_ids: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
    form: str,
) -> None:
    served = forms_served_on(form, make_engine, dora_dirs, adapter_dirs, oracle, prompt_ids, monkeypatch)
    assert all(kinds[-1] is DoraStep for kinds in served if DoraStep in kinds) and any(
        len(kinds) > 1 and DoraStep in kinds for kinds in served
    )


@pytest.mark.parametrize("memory_mode", ["unified", "static"])
def test_dora_in_both_memory_modes_matches_peft(
    make_engine: Any,
    dora_dirs: dict[str, Path],
    adapter_dirs: dict[str, Path],
    oracle: HfOracle,
    prompt_ids: list[list[int]],
    memory_mode: str,
) -> None:
    """Unified: the magnitudes live in the adapter's KV pages (and count toward them); static: own tensors."""
    engine = engine_with(make_engine, dora_dirs, memory_mode=memory_mode)
    plain = engine.runner.adapters["adapter-00"]
    dora = engine.runner.adapters["dora-all"]
    assert dora.num_bytes > 0 and plain.magnitudes == ()
    if memory_mode == "unified":
        transfers = engine.runner.transfers
        info = transfers.validate_adapter(dora_dirs["dora-all"])
        assert transfers.adapter_num_pages(info) == transfers.num_pages_of(dora)  # metadata == tensors
        pages = {t.untyped_storage().data_ptr() for t in engine.runner.kv_caches[0]}  # layer 0's K and V
        assert dora.magnitudes[0].untyped_storage().data_ptr() in pages  # a view of the pages
    assert_peft_tokens(engine, oracle, prompt_ids, mixed_rows(adapter_dirs, dora_dirs), memory_mode)


def test_dora_prefill_on_the_host_copy_gives_the_resident_tokens(
    make_engine: Any, dora_dirs: dict[str, Path], oracle: HfOracle, prompt_ids: list[list[int]]
) -> None:
    """CPU-assisted prefill: a cold DoRA adapter's first layer runs on its host copy (the rescale from the host
    copy's magnitudes), then the device copy."""
    assert_host_copy_prefill_gives_peft_tokens(
        make_engine, "dora-rs", dora_dirs["dora-rs"], oracle, prompt_ids[3]
    )


@pytest.mark.skipif(not can_pack_linear(torch.float32, CPU), reason="oneDNN packed linear unavailable here")
def test_weight_norm_from_the_packed_weight_equals_the_dense_norm() -> None:
    """With the dense weight dropped after packing, ||W + B A|| per row comes from ||W||^2, W A^T and B A."""
    generator = torch.Generator().manual_seed(0)
    dense = MergedLinear(24, {"q_proj": 16, "k_proj": 8}, False, torch.float32, CPU)
    dense.weight.data.copy_(torch.randn(24, 24, generator=generator))
    packed = MergedLinear(24, {"q_proj": 16, "k_proj": 8}, False, torch.float32, CPU)
    packed.weight.data.copy_(dense.weight.data)
    packed.pack()
    assert packed.weight.numel() == 0
    a, b = torch.randn(4, 24, generator=generator), torch.randn(8, 4, generator=generator)
    expected = torch.linalg.norm(dense.weight.data[16:24] + b @ a, dim=1)
    torch.testing.assert_close(dense.delta_row_norms(16, 24, a, b), expected)
    torch.testing.assert_close(packed.delta_row_norms(16, 24, a, b), expected, rtol=1e-5, atol=1e-5)


def test_dora_on_a_qwen2_model_keeps_the_qkv_bias_outside_the_rescale(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """Qwen2's q/k/v biases: y = g * (x W^T + s x A^T B^T) + bias (the bias is not rescaled); a short prompt
    (per-row gather) and a prompt longer than MAX_GATHER_ROWS (per-segment rescale) beside a plain row."""
    from tests.gpu_workers.engine.test_model_variants import make_model

    model_dir = make_model("qwen2_bias_tied", tmp_path / "qwen2", base_model_dir)
    dora = generate_adapter(
        model_dir, tmp_path / "dora", 4, ALL_MODULES, seed=5, use_rslora=True, use_dora=True
    )
    oracle = HfOracle(model_dir, {"dora": dora}, torch.float32)
    engine = LLMEngine(
        EngineConfig(model_path=model_dir, dtype="float32", num_kv_blocks=256, decode_step="eager")
    )
    engine.load_adapter("dora", dora)
    assert engine.runner.adapters["dora"].magnitudes[0].shape[0] == 2  # g and the bias shift
    generator = torch.Generator().manual_seed(0)
    long_prompt = torch.randint(4, 512, (MAX_GATHER_ROWS + 40,), generator=generator).tolist()
    prompts = [[1, 17, 42, 99, 7, 300], long_prompt, [1, 5, 9]]
    adapters: list[str | None] = ["dora", "dora", None]
    for prompt, adapter, out in zip(
        prompts, adapters, engine.generate(prompts, GREEDY, adapter_ids=adapters)
    ):
        assert out.token_ids == oracle.greedy(prompt, adapter, GREEDY.max_tokens), adapter


def test_the_gathered_and_the_per_segment_rescale_agree_with_the_formula() -> None:
    """DoraStep on random magnitudes: rows of two DoRA adapters around a plain row; g * y + shift per row."""
    columns = {"qkv": (0, 6), "o": (6, 10), "gate_up": (10, 18), "down": (18, 22)}
    generator = torch.Generator().manual_seed(0)

    def adapter(name: str) -> LoraAdapter:
        return LoraAdapter(name, 2, 1.0, (), ({},), 0, (torch.rand(2, 22, generator=generator) + 0.5,))

    a, b = adapter("a"), adapter("b")
    segments = (LoraSegment(0, 2, a), LoraSegment(3, 5, b))
    out = torch.randn(5, 8, generator=generator)
    expected = out.clone()
    for seg in segments:
        table = seg.adapter.magnitudes[0][:, 10:18]
        expected[seg.start : seg.end] = expected[seg.start : seg.end] * table[0] + table[1]
    gathered = out.clone()
    step = dora_step(segments, 5, columns)
    assert step is not None
    step.add_delta(gathered, gathered, 0, "gate_up")
    torch.testing.assert_close(gathered, expected)
    per_segment = out.clone()
    DoraStep(segments, MAX_GATHER_ROWS + 1, columns).add_delta(per_segment, per_segment, 0, "gate_up")
    torch.testing.assert_close(per_segment, expected)
    assert step.select_rows([2]) is None and step.select_rows([2, 3]) is not None


def test_a_dora_adapters_pages_count_its_magnitudes_in_every_layer() -> None:
    """From metadata: a DoRA adapter with LoRA on layer 0 only still holds magnitudes (g = 1) in layer 1, fp32
    viewed in bf16 page elements with the slack to align them."""
    slices = {"qkv": {"q_proj": (0, 8)}, "o": {"o_proj": (0, 8)}, "gate_up": {"up_proj": (0, 6)}, "down": {}}
    slices["down"] = {"down_proj": (0, 8)}
    in_features = {"qkv": 8, "o": 8, "gate_up": 8, "down": 6}
    plain = layer_numels_for(2, ("q_proj",), (0,), 2, in_features, slices)
    dora = layer_numels_for(2, ("q_proj",), (0,), 2, in_features, slices, dora_rows=1, page_element_size=2)
    assert plain == [[16, 16], []]
    assert dora == [[16, 16, 2 * 30 + 1], [2 * 30 + 1]]  # 8 + 8 + 6 + 8 columns, fp32 in bf16 pages


def test_bf16_pages_hold_the_fp32_magnitudes_exactly(
    make_engine: Any, dora_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    """A bf16 engine: the fp32 magnitudes sit in the unified pool's bf16 pages unrounded (an aligned fp32 view),
    equal to the static split's own tensors; both modes decode the same tokens."""
    engines = {
        mode: engine_with(make_engine, dora_dirs, dtype="bfloat16", memory_mode=mode)
        for mode in ("unified", "static")
    }
    unified, static = (engines[m].runner.adapters["dora-all"] for m in ("unified", "static"))
    assert engines["unified"].runner.kv_caches[0][0].dtype == torch.bfloat16
    for placed, own in zip(unified.magnitudes, static.magnitudes):
        assert placed.dtype == torch.float32 and torch.equal(placed, own)
    rows: list[str | None] = ["dora-all", "dora-rs", None, "adapter-00"]
    outs = {
        m: [o.token_ids for o in e.generate(prompt_ids, GREEDY, adapter_ids=rows)] for m, e in engines.items()
    }
    assert outs["unified"] == outs["static"]
