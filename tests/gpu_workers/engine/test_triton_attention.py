"""The triton attention forms (gpu_workers/engine/layers/triton_attention.py) read the KV pages in place and give
exact attention: decode and varlen prefill against float64 attention over each sequence's own positions, a mixed
step against the engine's SDPA forms, and an engine forced to them against transformers + peft. On CUDA the
kernels run compiled; without CUDA under Triton's interpreter, which must be chosen before triton itself is
imported (its standard library is jit-decorated at import): tests/gpu_workers/engine/triton_interpreter.py sets
TRITON_INTERPRET=1 first."""

from __future__ import annotations

import importlib

import torch

from tests.gpu_workers.engine.triton_interpreter import KERNEL_DEVICE, WHY_NO_KERNEL_DEVICE

DEVICE = KERNEL_DEVICE or torch.device("cpu")

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from gpu_workers.engine.layers import attention
from gpu_workers.engine.layers.attention import (
    DECODE_ATTENTION_FORMS,
    PREFILL_ATTENTION_FORMS,
    is_decode_form_usable,
    is_prefill_form_usable,
    paged_attention,
)
from gpu_workers.engine.layers.attention_candidates import (
    decode_attention_candidates,
    prefill_attention_candidates,
)
from gpu_workers.engine.layers.lora import LoraBatch
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.step_inputs import build_step_inputs
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry, Sequence
from settings.engine_kernels import KERNEL_FORMS

KERNELS_MODULE = "gpu_workers.engine.layers.triton_attention"
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 0.03}
NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 2, 16, 8


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    """The kernels module (compiled on CUDA, interpreted on the CPU); skips without triton."""
    if KERNEL_DEVICE is None:
        pytest.skip(WHY_NO_KERNEL_DEVICE)
    module = importlib.import_module(KERNELS_MODULE)
    assert module.IS_INTERPRETED == (DEVICE.type == "cpu")
    return module


def _page_pool(
    lens: list[int], generator: torch.Generator, fill: float = float("nan")
) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """k_cache, v_cache [num_slots, NUM_KV_HEADS, HEAD_DIM] holding random K/V at positions [0, lens[i]) of
    sequence i, on shuffled non-contiguous pages (with spare pages between), every other slot `fill`; and each
    sequence's block table."""
    num_pages = [-(-n // BLOCK_SIZE) for n in lens]
    pages = torch.randperm(2 * sum(num_pages) + 1, generator=generator).tolist()
    k_cache = torch.full((len(pages) * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), fill)
    v_cache = k_cache.clone()
    tables = []
    for n, used in zip(lens, num_pages):
        table, pages = pages[:used], pages[2 * used :]  # skip as many pages as it uses: not contiguous
        for slot in _slots(table, n):
            k_cache[slot] = torch.randn(NUM_KV_HEADS, HEAD_DIM, generator=generator)
            v_cache[slot] = torch.randn(NUM_KV_HEADS, HEAD_DIM, generator=generator)
        tables.append(table)
    return k_cache, v_cache, tables


def _slots(table: list[int], n: int) -> list[int]:
    return [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(n)]


def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float64 causal attention of the last q.shape[0] positions of a context: q [n, Hq, D], k, v [ctx, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * HEAD_DIM**-0.5
    q_pos = torch.arange(k.shape[0] - q.shape[0], k.shape[0]).unsqueeze(1)
    scores.masked_fill_(torch.arange(k.shape[0]).unsqueeze(0) > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _assert_close(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(out).all()
    err = (out.double().cpu() - expected).abs().max().item()
    assert err <= TOLERANCE[dtype] * (1 + expected.abs().max().item()), err


def _to(dtype: torch.dtype, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(dtype=dtype, device=DEVICE) for t in tensors]


def _table_tensor(tables: list[list[int]]) -> torch.Tensor:
    """[num_seqs, max_blocks] with page 0 (another sequence's, or a spare page of NaN) as padding."""
    out = torch.zeros(len(tables), max(map(len, tables)), dtype=torch.long)
    for i, table in enumerate(tables):
        out[i, : len(table)] = torch.tensor(table)
    return out.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_reads_only_each_sequences_own_pages(
    kernels: ModuleType, dtype: torch.dtype, group: int, num_splits: int
) -> None:
    """One query per sequence of 1..37 tokens on shuffled pages (several tiles, some splits empty) is exact
    attention over its own positions: the NaN in every other slot of the pool is never read."""
    generator = torch.Generator().manual_seed(group * 10 + num_splits)
    lens = [1, 5, 8, 17, 37]
    k_cache, v_cache, tables = _page_pool(lens, generator)
    q = torch.randn(len(lens), NUM_KV_HEADS * group, HEAD_DIM, generator=generator)
    expected = torch.stack(
        [
            _exact(q[i : i + 1], k_cache[_slots(t, n)], v_cache[_slots(t, n)])[0]
            for i, (t, n) in enumerate(zip(tables, lens))
        ]
    )
    q_d, k_d, v_d = _to(dtype, q, k_cache, v_cache)
    lens_t = torch.tensor(lens, device=DEVICE)
    out = kernels.paged_decode_attention(
        q_d, k_d, v_d, _table_tensor(tables), lens_t, BLOCK_SIZE, HEAD_DIM**-0.5, num_splits, block_n=16
    )
    assert out.shape == q.shape and out.dtype == dtype
    _assert_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
def test_varlen_prefill_is_causal_attention_over_cached_prefix_and_new_tokens(
    kernels: ModuleType, dtype: torch.dtype, group: int
) -> None:
    """Packed chunks of different lengths (whole prompts, and chunks after 24 and 29 cached tokens), with other
    rows between them, each causal attention over its sequence's pages; rows of no chunk are left untouched."""
    generator = torch.Generator().manual_seed(group)
    chunks = [(7, 7), (13, 37), (16, 16), (1, 30), (37, 37)]  # (new tokens, context length)
    k_cache, v_cache, tables = _page_pool([ctx for _, ctx in chunks], generator)
    q_starts = [1 + sum(q_len + 2 for q_len, _ in chunks[:i]) for i in range(len(chunks))]  # 2 rows between
    num_rows = q_starts[-1] + chunks[-1][0] + 1
    q = torch.randn(num_rows, NUM_KV_HEADS * group, HEAD_DIM, generator=generator)
    q_d, k_d, v_d = _to(dtype, q, k_cache, v_cache)
    out = torch.full_like(q_d, 7.0)
    as_int = lambda values: torch.tensor(values, dtype=torch.int32, device=DEVICE)
    kernels.paged_prefill_attention(
        q_d,
        k_d,
        v_d,
        _table_tensor(tables),
        as_int(q_starts),
        as_int([q_len for q_len, _ in chunks]),
        as_int([ctx for _, ctx in chunks]),
        max(q_len for q_len, _ in chunks),
        BLOCK_SIZE,
        HEAD_DIM**-0.5,
        out=out,
        block_m=16,
        block_n=16,
    )
    is_chunk_row = torch.zeros(num_rows, dtype=torch.bool)
    for start, (q_len, ctx), table in zip(q_starts, chunks, tables):
        rows = slice(start, start + q_len)
        slots = _slots(table, ctx)
        _assert_close(out[rows], _exact(q[rows], k_cache[slots], v_cache[slots]), dtype)
        is_chunk_row[rows] = True
    assert (out[~is_chunk_row.to(DEVICE)] == 7.0).all()


def _mixed_step(generator: torch.Generator) -> tuple[list[BatchEntry], torch.Tensor, torch.Tensor]:
    """A step of two equal whole prompts, a chunk after 24 cached tokens and two decodes (contexts 9 and 20) on
    one shuffled pool whose unused slots hold huge finite values (the engine's cache is finite); the cached
    positions' K/V already in the pool."""
    # (tokens computed before the step, tokens in the step)
    shapes = [(0, 13), (0, 13), (24, 13), (8, 1), (19, 1)]
    lens = [done + new for done, new in shapes]
    k_cache, v_cache, tables = _page_pool(lens, generator, fill=6e4)
    entries = []
    for i, ((done, new), table) in enumerate(zip(shapes, tables)):
        seq = Sequence(f"r{i}", list(range(1, done + new + 1)), SamplingParams(), None, 4)
        seq.num_computed_tokens, seq.block_table = done, table
        entries.append(BatchEntry(seq, new))
    return entries, k_cache, v_cache


@pytest.mark.parametrize("group", [1, 4])
def test_a_mixed_step_with_the_triton_forms_matches_the_sdpa_forms(kernels: ModuleType, group: int) -> None:
    """The engine's step (build_step_inputs + paged_attention: new K/V written, then prefill and decode) gives
    the same output with both triton forms as with the SDPA forms, and writes the same cache."""
    generator = torch.Generator().manual_seed(5)
    entries, k_cache, v_cache = _mixed_step(generator)
    num_tokens = sum(e.num_new_tokens for e in entries)
    q = torch.randn(num_tokens, NUM_KV_HEADS * group, HEAD_DIM, generator=generator)
    k, v = (torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    outputs, caches = {}, {}
    for form in ("sdpa", "triton"):
        inputs = build_step_inputs(entries, LoraBatch(), BLOCK_SIZE, form, DEVICE, prefill_form=form)
        assert (inputs.attention.varlen_prefill is not None) == (form == "triton")
        k_pool, v_pool, q_d, k_d, v_d = _to(torch.float32, k_cache, v_cache, q, k, v)
        out = paged_attention(q_d, k_d, v_d, k_pool, v_pool, inputs.attention, HEAD_DIM**-0.5)
        outputs[form], caches[form] = out.cpu(), [k_pool.cpu(), v_pool.cpu()]
    assert torch.isfinite(outputs["triton"]).all()
    torch.testing.assert_close(outputs["triton"], outputs["sdpa"], atol=2e-5, rtol=2e-5)
    assert all(torch.equal(a, b) for a, b in zip(caches["triton"], caches["sdpa"]))


def test_the_tuners_candidates_compute_the_same_attention(kernels: ModuleType) -> None:
    """What the kernel tuner times (first on a GPU) is the same attention in each form: decode over pools of
    shuffled pages, and a prefill step of whole prompts and a chunk after cached tokens."""
    shape = (4, 2, HEAD_DIM, torch.float32, DEVICE, BLOCK_SIZE)
    decode = decode_attention_candidates(("sdpa", "triton"), *shape, num_seqs=3, context_len=21, num_pools=2)
    for _ in range(2):  # each pool once
        torch.testing.assert_close(decode["triton"](), decode["sdpa"](), atol=2e-5, rtol=2e-5)
    prefill = prefill_attention_candidates(("sdpa", "triton"), *shape, chunks=((7, 7), (5, 5), (13, 37)))
    torch.testing.assert_close(prefill["triton"](), prefill["sdpa"](), atol=2e-5, rtol=2e-5)


def test_the_triton_forms_are_candidates_only_on_cuda_with_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not on the CPU (the interpreter is a test tool), on CUDA where triton imports; the settings list them."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(attention.importlib.util, "find_spec", lambda name: object())  # triton "installed"
    assert not is_decode_form_usable("triton", cpu, torch.float32)
    assert not is_prefill_form_usable("triton", cpu, torch.bfloat16)
    assert "need CUDA" in (attention.triton_unusable_reason(cpu, torch.float32) or "")
    assert is_decode_form_usable("triton", cuda, torch.bfloat16)
    assert is_prefill_form_usable("triton", cuda, torch.float16)
    monkeypatch.setattr(attention.importlib.util, "find_spec", lambda name: None)
    assert not is_decode_form_usable("triton", cuda, torch.bfloat16)
    assert not is_prefill_form_usable("triton", cuda, torch.bfloat16)
    assert "triton package" in (attention.triton_unusable_reason(cuda, torch.bfloat16) or "")
    assert KERNEL_FORMS["decode_attention"] == DECODE_ATTENTION_FORMS
    assert KERNEL_FORMS["prefill_attention"] == PREFILL_ATTENTION_FORMS


def test_forcing_triton_on_the_cpu_is_refused_with_the_reason(make_engine: Callable[..., LLMEngine]) -> None:
    with pytest.raises(
        ValueError, match=r"prefill_attention 'triton' cannot run here; usable: \['sdpa'\] \(.*CUDA"
    ):
        make_engine(device="cpu", prefill_attention="triton")
    with pytest.raises(ValueError, match=r"decode_attention 'triton' cannot run here; .*CUDA"):
        make_engine(device="cpu", decode_attention="triton")


def test_an_unforced_cpu_engine_never_measures_or_picks_triton(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(device="cpu")
    plan = engine.runner.kernel_plan
    assert plan.prefill_attention == "sdpa" and plan.decode_attention != "triton"
    assert "prefill_attention" not in engine.runner.kernel_tuner.choices  # one usable form: nothing measured


def test_an_engine_on_the_triton_forms_gives_peft_tokens(
    kernels: ModuleType,
    make_engine: Callable[..., LLMEngine],
    hf_oracle: Any,
    prompt_ids: list[list[int]],
    adapter_dirs: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tiny model with both triton forms (interpreted on the CPU) decodes a mixed batch of adapters to
    peft's greedy tokens, twice, its prompts in chunks of a 16-token step budget (later chunks attend to earlier
    ones from the pages); the second time the prompts' full blocks come from the prefix cache."""
    if DEVICE.type == "cpu":
        monkeypatch.setattr(attention, "triton_unusable_reason", lambda device, dtype: None)
    engine = make_engine(
        device=DEVICE.type,
        decode_attention="triton",
        prefill_attention="triton",
        block_size=4,
        enable_prefix_caching=True,
        max_num_batched_tokens=16,
    )
    plan = engine.runner.kernel_plan
    assert (plan.decode_attention, plan.prefill_attention) == ("triton", "triton")
    adapters: list[str | None] = [None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    for _ in range(2):
        for prompt, adapter, out in zip(
            prompts, adapters, engine.generate(prompts, greedy, adapter_ids=adapters)
        ):
            assert out.token_ids == hf_oracle.greedy(prompt, adapter, 5), adapter
    assert engine.engine_stats().num_prefix_cache_hit_tokens > 0


def test_where_triton_runs_the_tuner_measures_it_for_both_ops(
    kernels: ModuleType,
    make_engine: Callable[..., LLMEngine],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    """With the triton forms usable (CUDA with triton; here the interpreter stands in), decode and prefill
    attention are measured against the SDPA forms on the model's shapes and the faster kept."""
    from gpu_workers.engine.kernel_tuner import KernelTuner

    measured: dict[str, list[str]] = {}

    def fake_measure(self: KernelTuner, candidates: dict[str, Any]) -> dict[str, float]:
        names = list(candidates)
        measured[",".join(names)] = names
        return {name: (1.0 if name == "triton" else 3.0) for name in names}

    monkeypatch.setattr(attention, "triton_unusable_reason", lambda device, dtype: None)
    monkeypatch.setattr(KernelTuner, "measure", fake_measure)
    engine = make_engine(device="cpu", kernel_choices_path=tmp_path / "choices.json")
    plan = engine.runner.kernel_plan
    assert (plan.decode_attention, plan.prefill_attention) == ("triton", "triton")
    assert ["sdpa", "triton"] in measured.values()
    assert any(names[0] == "sdpa" and names[-1] == "triton" and len(names) > 2 for names in measured.values())
    sources = engine.runner_stats().kernel_choice_sources
    assert sources["decode_attention"] == sources["prefill_attention"] == "measured"
