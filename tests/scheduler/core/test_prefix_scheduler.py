"""Batch scheduler with the prefix KV cache: admission reuses cached blocks of the same adapter and cache
namespace, only uncomputed tokens cost budget, and no cached block survives its adapter leaving the device
(hypothesis).

The stand-in executor keeps a model of each page's KV (namespace that computed it, adapter, adapter load
epoch, token prefix) and checks before every step that each sequence's computed tokens are backed by exactly
the KV they need, computed in its own namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import Sequence, SequenceStatus
from scheduler.core.step_plan import StepPlan

PAGE_BYTES = 100
BS = 4


def make_scheduler(
    num_kv_pages: int, num_adapter_pages: int, max_num_seqs: int, max_tokens: int
) -> BatchScheduler:
    """num_adapter_pages 0: a unified pool of num_kv_pages; else a static split. One CPU prefill worker; the
    stand-in executor (`carry_out`) lands a planned load at once, so a cold adapter's requests run from the
    step after the one that planned it."""
    pool = PagePool(num_kv_pages + num_adapter_pages, BS, num_kv_pages)
    residency = AdapterResidency(pool, PAGE_BYTES)
    return BatchScheduler(
        pool,
        residency,
        FifoPolicy(),
        max_num_seqs,
        max_tokens,
        prefix_cache=PrefixCache(pool),
        num_cpu_prefill_workers=1,
    )


def make_seq(
    request_id: str, prompt: list[int], max_tokens: int, adapter_id: str | None, namespace: str | None = None
) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Sequence(request_id, list(prompt), params, adapter_id, max_tokens, cache_namespace=namespace)


@dataclass
class KvModel:
    """What each page's KV holds: page -> (namespace, adapter, epoch, token prefix up to the last written slot)."""

    content: dict[int, tuple[str | None, str | None, int, tuple[int, ...]]]
    epoch: dict[str | None, int]

    def check(self, seq: Sequence) -> None:
        """Every computed token of seq is backed by KV computed in its namespace, of its adapter's current epoch
        and its own prefix."""
        for i, page in enumerate(seq.block_table):
            end = min(seq.num_computed_tokens, (i + 1) * BS)
            if end <= i * BS:
                break
            namespace, adapter, epoch, prefix = self.content[page]
            assert namespace == seq.cache_namespace, "KV computed in another namespace"
            assert (adapter, epoch) == (seq.adapter_id, self.epoch[seq.adapter_id]), "stale or foreign KV"
            assert prefix[:end] == tuple(seq.token_ids[:end]) and len(prefix) >= end, "KV of another prefix"

    def write(self, seq: Sequence, start: int, end: int) -> None:
        for i in range(start // BS, -(-end // BS)):
            self.content[seq.block_table[i]] = (
                seq.cache_namespace,
                seq.adapter_id,
                self.epoch[seq.adapter_id],
                tuple(seq.token_ids[: min(end, (i + 1) * BS)]),
            )


def carry_out(scheduler: BatchScheduler, plan: StepPlan, kv: KvModel) -> None:
    for adapter_id in plan.adapter_evictions:
        kv.epoch[adapter_id] += 1
    for load in plan.adapter_loads:
        scheduler.on_adapter_loaded(load.adapter_id)
    for entry in plan.entries:
        seq = entry.seq
        kv.check(seq)
        kv.write(seq, seq.num_computed_tokens, seq.num_computed_tokens + entry.num_new_tokens)
    sampled: list[int | None] = [e.seq.num_tokens % 2 for e in plan.entries if e.is_sampling]
    scheduler.update_from_output(plan, sampled, now=scheduler.clock())


def check_state(scheduler: BatchScheduler) -> None:
    cache, pool, residency = scheduler.prefix_cache, scheduler.pool, scheduler.residency
    assert cache is not None
    on_device = {a for a in residency.device_adapters()}
    assert set(cache.adapters()) <= on_device | {None}, "cached KV of an adapter that left the device"
    refs: dict[int, int] = {}
    own: list[int] = []
    for seq in scheduler.running:
        for page in seq.block_table[: seq.num_cached_blocks]:
            refs[page] = refs.get(page, 0) + 1
        own += seq.block_table[seq.num_cached_blocks :]
    for seq in scheduler.waiting.values():
        assert not seq.block_table and seq.num_cached_blocks == 0
    cached = {b.page for b in cache.blocks()}
    assert len(own) == len(set(own)) and not cached & set(own)
    assert pool.num_kv_pages == len(cached) + len(own)
    for block in cache.blocks():
        assert block.ref_count == refs.get(block.page, 0)
    assert pool.num_used_pages + pool.num_free_pages == pool.num_pages


prompts = st.lists(st.integers(0, 1), min_size=1, max_size=14)
workloads = st.lists(
    st.tuples(
        prompts,
        st.integers(1, 5),
        st.sampled_from([None, "a0", "a1", "a2"]),
        st.integers(0, 6),
        st.sampled_from([None, "tenant:a", "tenant:b"]),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=200, deadline=None)
@given(
    num_kv_pages=st.integers(7, 24),  # a unified adapter (2 pages) + the longest request (5 pages) fit
    num_adapter_pages=st.one_of(st.just(0), st.integers(2, 6)),  # 0: unified; else a share an adapter fits
    max_num_seqs=st.integers(1, 5),
    max_tokens=st.integers(1, 24),
    workload=workloads,
    evictions=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["a0", "a1", "a2"])), max_size=6),
)
def test_cached_kv_is_always_valid_and_every_request_finishes(
    num_kv_pages: int,
    num_adapter_pages: int,
    max_num_seqs: int,
    max_tokens: int,
    workload: list[tuple[list[int], int, str | None, int, str | None]],
    evictions: list[tuple[int, str]],
) -> None:
    scheduler = make_scheduler(num_kv_pages, num_adapter_pages, max_num_seqs, max_tokens)
    residency = scheduler.residency
    for name in ("a0", "a1", "a2"):
        residency.register(name, f"/host/{name}", rank=2, num_bytes=150)
    kv = KvModel({}, {None: 0, "a0": 0, "a1": 0, "a2": 0})
    seqs: list[Sequence] = []
    pending = sorted(enumerate(workload), key=lambda x: x[1][3])
    for step in range(3000):
        while pending and pending[0][1][3] <= step:
            i, (prompt, max_out, adapter, _, namespace) = pending.pop(0)
            seq = make_seq(f"r{i}", prompt, max_out, adapter, namespace)
            scheduler.add(seq)
            seqs.append(seq)
        for _ in [e for e in evictions if e[0] == step]:  # an idle adapter unloaded / replaced from outside
            state = residency.get(_[1])
            if state is not None and state.residency is Residency.DEVICE and state.num_running == 0:
                residency.evict(_[1])
                kv.epoch[_[1]] += 1
        if not pending and not scheduler.has_unfinished():
            break
        plan = scheduler.schedule()
        assert plan.num_batched_tokens <= max_tokens
        carry_out(scheduler, plan, kv)
        check_state(scheduler)
    assert all(s.is_finished for s in seqs)
    cache = scheduler.prefix_cache
    assert cache is not None
    assert scheduler.pool.num_kv_pages == cache.num_cached_blocks == cache.num_evictable_blocks


def test_second_request_reuses_the_shared_prefix_and_only_its_rest_costs_budget() -> None:
    scheduler = make_scheduler(32, 8, 4, 64)
    scheduler.residency.register("a", "/host/a", rank=2, num_bytes=150)
    kv = KvModel({}, {None: 0, "a": 0})
    prefix = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # two full blocks + 2
    first = make_seq("first", prefix + [7], 1, "a")
    scheduler.add(first)
    carry_out(scheduler, scheduler.schedule(), kv)  # plans (and lands) "a"'s load
    carry_out(scheduler, scheduler.schedule(), kv)
    assert first.is_finished
    second = make_seq("second", prefix + [8, 8], 1, "a")
    scheduler.add(second)
    plan = scheduler.schedule()
    [entry] = plan.entries
    assert second.num_cached_blocks == 2 and second.num_computed_tokens == 8 and entry.num_new_tokens == 4
    carry_out(scheduler, plan, kv)
    cache = scheduler.prefix_cache
    assert cache is not None and (cache.num_hit_tokens, cache.num_query_tokens) == (8, 11 + 12)


def test_same_prompt_under_another_adapter_or_after_its_adapter_left_gets_no_hit() -> None:
    scheduler = make_scheduler(32, 8, 4, 64)
    for name in ("a", "b"):
        scheduler.residency.register(name, f"/host/{name}", rank=2, num_bytes=150)
    kv = KvModel({}, {None: 0, "a": 0, "b": 0})
    prompt = list(range(9))
    scheduler.add(make_seq("a1", prompt, 1, "a"))
    carry_out(scheduler, scheduler.schedule(), kv)
    other = make_seq("b1", prompt, 1, "b")
    scheduler.add(other)
    scheduler.schedule()
    assert other.num_computed_tokens == 0 and other.num_cached_blocks == 0
    scheduler.finish(other, "abort")
    scheduler.residency.evict("a")
    cache = scheduler.prefix_cache
    assert cache is not None and "a" not in cache.adapters()
    again = make_seq("a2", prompt, 1, "a")
    scheduler.add(again)
    scheduler.schedule()
    assert again.num_computed_tokens == 0


def test_kv_pressure_evicts_unreferenced_cached_blocks_before_adapters_and_preemption() -> None:
    scheduler = make_scheduler(6, 0, 4, 64)  # adapter "a" takes 2 KV-addressable pages
    scheduler.residency.register("a", "/host/a", rank=2, num_bytes=150)
    kv = KvModel({}, {None: 0, "a": 0})
    scheduler.add(make_seq("warm", list(range(17)), 1, None))  # 4 full blocks get cached, 5 pages used
    carry_out(scheduler, scheduler.schedule(), kv)
    cache = scheduler.prefix_cache
    assert cache is not None and cache.num_cached_blocks == 4 and scheduler.pool.num_free_blocks == 2
    scheduler.add(idle := make_seq("idle-adapter", [1], 1, "a"))
    while not idle.is_finished:
        carry_out(scheduler, scheduler.schedule(), kv)  # "a" stays on the device, idle
    big = make_seq("big", [9] * 16, 1, None)  # needs 4 pages: only the cached blocks can make room
    scheduler.add(big)
    plan = scheduler.schedule()
    assert [e.seq for e in plan.entries] == [big] and not plan.preemptions and not plan.adapter_evictions
    assert cache.num_cached_blocks == 0 and big.status is SequenceStatus.RUNNING


def test_a_prompt_another_namespace_cached_gets_no_hit_but_the_same_namespace_repeat_does() -> None:
    scheduler = make_scheduler(32, 8, 4, 64)
    scheduler.residency.register("public", "/host/public", rank=2, num_bytes=150)
    assert scheduler.residency.plan_load("public", may_evict_waiting=False) == []
    scheduler.residency.mark_loaded("public")
    kv = KvModel({}, {None: 0, "public": 0})
    prompt = list(range(9))  # two full blocks + 1
    cache = scheduler.prefix_cache
    assert cache is not None
    for adapter in (None, "public"):
        for i, (namespace, num_hit_blocks) in enumerate([("tenant:a", 0), ("tenant:b", 0), ("tenant:a", 2)]):
            seq = make_seq(f"{adapter}-{i}", prompt, 1, adapter, namespace)
            scheduler.add(seq)
            plan = scheduler.schedule()
            assert seq.num_cached_blocks == num_hit_blocks, (adapter, namespace)
            assert [e.num_new_tokens for e in plan.entries] == [9 - 4 * num_hit_blocks]
            carry_out(scheduler, plan, kv)
            carry_out(scheduler, scheduler.schedule(), kv)  # sample until it finishes
    assert (cache.num_hit_tokens, cache.num_query_tokens) == (2 * 8, 6 * 9)
