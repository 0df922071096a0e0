"""with_unseen: requests routed since a worker's view was published count as queued there."""

from __future__ import annotations

from scheduler.routing.router import WorkerView, tenant_load
from scheduler.routing.unseen import UnseenRequests, with_unseen

UNSEEN = UnseenRequests(num_requests=2, num_prompt_tokens=30, ranks=(8, 16), num_by_tenant={"t1": 2})


def test_unseen_requests_raise_the_load_the_ranks_and_the_prompt_tokens() -> None:
    view = WorkerView("w0", "base", num_running=2, num_waiting=1, max_num_seqs=8, waiting_ranks=(4,))
    seen = with_unseen(view, UNSEEN)
    assert seen.load == 5 / 8
    assert seen.waiting_ranks == (4, 8, 16) and seen.num_waiting_prompt_tokens == 30


def test_a_view_without_queues_per_tenant_keeps_counting_every_queued_request() -> None:
    view = WorkerView("w0", "base", num_waiting=3, max_num_seqs=8)
    seen = with_unseen(view, UNSEEN)
    assert seen.num_waiting_by_tenant == {}
    assert tenant_load(seen, "t2") == 5 / 8


def test_per_tenant_queues_grow_where_the_view_publishes_them() -> None:
    view = WorkerView("w0", "base", num_waiting=1, max_num_seqs=8, num_waiting_by_tenant={"t2": 1})
    assert with_unseen(view, UNSEEN).num_waiting_by_tenant == {"t2": 1, "t1": 2}
    idle = WorkerView("w1", "base", max_num_seqs=8)
    assert with_unseen(idle, UNSEEN).num_waiting_by_tenant == {"t1": 2}


def test_no_unseen_request_leaves_the_view_as_it_is() -> None:
    view = WorkerView("w0", "base", num_waiting=1)
    assert with_unseen(view, UnseenRequests()) is view
