"""The engine's helper threads (adapter preparation and copies, CPU-assisted prefill) run their torch ops on
one OpenMP thread, without changing the engine thread's count or the count later threads start with
(gpu_workers/engine/thread_limits.py says why: a second OpenMP team slows every decode step)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import torch

from gpu_workers.engine.adapter_copier import AdapterCopier
from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.thread_limits import limit_this_thread


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The calling thread at 2 torch threads (a count a helper's 1 can be told from), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def in_thread(target: Callable[[], Any]) -> Any:
    """`target()`'s result, run on a new thread."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(target()))
    thread.start()
    thread.join()
    return result[0]


def test_a_limited_thread_runs_alone_and_leaves_the_others_their_count(two_threads: None) -> None:
    def limited() -> int:
        limit_this_thread(1)
        x = torch.randn(256, 256)
        assert torch.allclose(x @ x, (x.double() @ x.double()).float(), atol=1e-3)  # still computes
        return torch.get_num_threads()

    assert in_thread(limited) == 1
    assert torch.get_num_threads() == 2
    # torch.set_num_threads(1) in the helper would have made this 1 (a process-wide setting)
    assert in_thread(torch.get_num_threads) == 2


def test_a_thread_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="num_threads"):
        limit_this_thread(0)


def test_the_adapter_preparer_and_copier_threads_run_on_one_thread(two_threads: None) -> None:
    copier = AdapterCopier(torch.device("cpu"))
    seen: dict[str, int] = {}
    host_copy = cast(LoraAdapter, object())

    def prepare() -> LoraAdapter:
        seen["prepare"] = torch.get_num_threads()
        return host_copy

    def place(adapter: LoraAdapter) -> LoraAdapter:
        seen["copy"] = torch.get_num_threads()
        return adapter

    copier.start("a", prepare=prepare, place=place)
    assert copier.landed("a", wait=True) is host_copy
    assert seen == {"prepare": 1, "copy": 1}
    assert torch.get_num_threads() == 2


def test_the_cpu_prefill_pool_runs_on_one_thread(
    make_engine: Callable[..., LLMEngine], two_threads: None
) -> None:
    engine = make_engine(cpu_prefill_workers=1)
    pool = engine.runner.transfers._cpu_workers()
    assert pool.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == 2
