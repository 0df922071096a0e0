"""Prefix caching in the engine: a shared prompt prefix of the same adapter (version) and cache namespace is
computed once, the tokens are the ones prefix caching off gives (greedy and seeded sampling), KV never outlives
its adapter, and no tenant hits blocks another tenant's namespace computed (the TTFT side channel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from settings import Settings

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def prompts(prompt_ids: list[list[int]]) -> list[list[int]]:
    """Two prompts sharing a long prefix (several full blocks), different tails."""
    prefix = prompt_ids[3] + prompt_ids[1][1:]
    return [prefix + prompt_ids[2][1:], prefix + prompt_ids[0][1:]]


def run_one_after_another(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, adapter: str | None
) -> list[tuple[list[int], str]]:
    outs = [engine.generate([p], params, adapter_ids=[adapter])[0] for p in prompts]
    return [(o.token_ids, o.text) for o in outs]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("adapter", ["adapter-01", None])
def test_shared_prefix_gives_the_same_tokens_and_computes_fewer_prompt_tokens(
    make_engine: Any, prompts: list[list[int]], params: SamplingParams, adapter: str | None
) -> None:
    cached = make_engine(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    plain = make_engine(block_size=BLOCK_SIZE, enable_prefix_caching=False)
    assert run_one_after_another(cached, prompts, params, adapter) == run_one_after_another(
        plain, prompts, params, adapter
    )
    on, off = cached.engine_stats(), plain.engine_stats()
    num_shared_blocks = (len(prompts[0]) - len(prompts[0]) % BLOCK_SIZE) // BLOCK_SIZE
    assert on.num_prefix_cache_hit_tokens >= (num_shared_blocks - 1) * BLOCK_SIZE > 0
    assert on.num_prefix_cache_query_tokens == sum(len(p) for p in prompts)
    assert on.num_batched_tokens == off.num_batched_tokens - on.num_prefix_cache_hit_tokens
    assert off.num_prefix_cache_hit_tokens == 0 and off.num_cached_blocks == 0
    assert on.num_cached_blocks > 0
    # cached blocks are reclaimable; resident adapters hold the rest (unified pool)
    assert on.num_free_kv_blocks == on.num_kv_blocks - on.num_adapter_pages


def test_concurrent_requests_sharing_a_prefix_match_prefix_caching_off(
    make_engine: Any, prompts: list[list[int]]
) -> None:
    cached = make_engine(block_size=BLOCK_SIZE, max_num_batched_tokens=6)  # chunked prefills
    plain = make_engine(block_size=BLOCK_SIZE, max_num_batched_tokens=6, enable_prefix_caching=False)
    params = [GREEDY, SEEDED, GREEDY, SEEDED]
    batch = [prompts[0], prompts[1], prompts[1], prompts[0]]
    adapters = ["adapter-02", "adapter-02", None, "adapter-02"]
    for engine in (cached, plain):  # warm one adapter's prefix, then a batch joins it mid-stream
        engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-02"])
    got = [o.token_ids for o in cached.generate(batch, params, adapter_ids=adapters)]
    want = [o.token_ids for o in plain.generate(batch, params, adapter_ids=adapters)]
    assert got == want
    assert cached.engine_stats().num_prefix_cache_hit_tokens > 0


def test_another_adapter_or_a_new_adapter_version_gets_no_hit(
    make_engine: Any, adapter_dirs: dict[str, Path], prompts: list[list[int]]
) -> None:
    engine = make_engine(block_size=BLOCK_SIZE)
    engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-00"])
    assert engine.engine_stats().num_prefix_cache_hit_tokens == 0
    engine.load_adapter("adapter-00@v2", adapter_dirs["adapter-00"])  # same files, another version id
    for adapter in ("adapter-01", "adapter-00@v2", None):
        engine.generate([prompts[0]], GREEDY, adapter_ids=[adapter])
        assert engine.engine_stats().num_prefix_cache_hit_tokens == 0, adapter
    engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-00"])
    assert engine.engine_stats().num_prefix_cache_hit_tokens > 0


def test_after_its_adapter_leaves_the_device_a_request_recomputes(
    make_engine: Any, adapter_dirs: dict[str, Path], prompts: list[list[int]]
) -> None:
    engine = make_engine(block_size=BLOCK_SIZE)
    [first] = engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-03"])
    num_cached = engine.engine_stats().num_cached_blocks
    assert num_cached > 0
    engine.unload_adapter("adapter-03")  # its KV goes with it
    assert engine.engine_stats().num_cached_blocks == 0
    engine.load_adapter("adapter-03", adapter_dirs["adapter-03"])
    [again] = engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-03"])
    assert engine.engine_stats().num_prefix_cache_hit_tokens == 0 and again.token_ids == first.token_ids


def test_evicting_an_adapter_for_another_one_drops_its_cached_blocks(
    make_engine: Any, prompts: list[list[int]]
) -> None:
    probe = make_engine(block_size=BLOCK_SIZE, memory_mode="static")
    big = max(probe.device_adapters(), key=lambda a: len(probe.residency.get(a).page_ids))
    share = len(probe.residency.get(big).page_ids) * probe.runner.kv_bytes_per_block()  # room for `big` alone
    engine = make_engine(block_size=BLOCK_SIZE, memory_mode="static", adapter_cache_bytes=share)
    engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-00"])
    engine.generate([prompts[0]], GREEDY, adapter_ids=[big])  # evicts adapter-00 (no room for both)
    assert engine.adapter_residency("adapter-00") == "host"
    engine.generate([prompts[0]], GREEDY, adapter_ids=["adapter-00"])  # copied back: computes again
    assert engine.engine_stats().num_prefix_cache_hit_tokens == 0


def hit_tokens_as(
    engine: LLMEngine, tenant: str, namespace: str | None, prompt: list[int], adapter: str | None
) -> tuple[int, list[int]]:
    """Run one request of `tenant` in `namespace` to completion; returns (its prefix-cache hit tokens, tokens)."""
    before = engine.engine_stats().num_prefix_cache_hit_tokens
    request_id = f"{tenant}-{next(engine._request_counter)}"
    engine.add_request(
        EngineRequest(request_id, prompt, GREEDY, adapter, tenant_id=tenant, cache_namespace=namespace)
    )
    seq = engine.scheduler.get(request_id)
    assert seq is not None
    while not seq.is_finished:
        engine.step()
    return engine.engine_stats().num_prefix_cache_hit_tokens - before, seq.output_token_ids


@pytest.mark.parametrize("adapter", [None, "adapter-01"], ids=["base-model", "public-adapter"])
def test_another_tenant_gets_no_hit_on_a_prompt_a_tenant_sent_but_its_own_repeat_hits(
    make_engine: Any, prompts: list[list[int]], adapter: str | None
) -> None:
    engine = make_engine(block_size=BLOCK_SIZE)
    hits_a, tokens_a = hit_tokens_as(engine, "a", "tenant:a", prompts[0], adapter)
    assert hits_a == 0 and engine.engine_stats().num_cached_blocks > 0
    hits_b, tokens_b = hit_tokens_as(engine, "b", "tenant:b", prompts[0], adapter)
    assert hits_b == 0, "tenant b hit blocks tenant a computed: b's TTFT tells that a sent this prompt"
    hits_a_again, tokens_a_again = hit_tokens_as(engine, "a", "tenant:a", prompts[0], adapter)
    assert hits_a_again >= BLOCK_SIZE  # a's own repeat still hits
    assert tokens_a == tokens_b == tokens_a_again


def test_tenants_an_operator_put_in_one_namespace_share_cached_blocks(
    make_engine: Any, prompts: list[list[int]]
) -> None:
    engine = make_engine(block_size=BLOCK_SIZE)
    assert hit_tokens_as(engine, "a", "shared:team", prompts[0], "adapter-02")[0] == 0
    assert hit_tokens_as(engine, "b", "shared:team", prompts[0], "adapter-02")[0] >= BLOCK_SIZE
    assert hit_tokens_as(engine, "c", "tenant:c", prompts[0], "adapter-02")[0] == 0  # not in it: isolated


def test_prefix_caching_setting_reaches_the_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_workers.worker.builder import engine_config_from_settings

    assert EngineConfig(model_path=tmp_path).enable_prefix_caching
    assert engine_config_from_settings(Settings(base_model_path=tmp_path)).enable_prefix_caching
    monkeypatch.setenv("LORAHOST_ENGINE_ENABLE_PREFIX_CACHING", "false")
    assert not engine_config_from_settings(Settings(base_model_path=tmp_path)).enable_prefix_caching
