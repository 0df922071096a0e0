"""ChoiceStreams (api/inference/choice_streams.py): the events of n worker streams merged with their choice
index, each stream's order kept; closing it mid-way closes every stream before its end (which aborts the
engine requests) with no read left pending."""

from __future__ import annotations

import asyncio

from api.inference.choice_streams import ChoiceStreams
from api.worker_client import WorkerStream
from cluster.protocol import GenerateEvent


class QueueSource:
    """A stream's events after its first, handed over by the test through a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[GenerateEvent | None] = asyncio.Queue()
        self.closed_before_end: bool | None = None
        self.num_reads_pending = 0

    async def next_event(self) -> GenerateEvent | None:
        self.num_reads_pending += 1
        try:
            return await self.queue.get()
        finally:
            self.num_reads_pending -= 1

    async def aclose(self, has_ended: bool) -> None:
        self.closed_before_end = not has_ended


def delta(text: str) -> GenerateEvent:
    return GenerateEvent(type="delta", text=text, token_ids=[1])


def streams(num: int) -> tuple[ChoiceStreams, list[QueueSource]]:
    sources = [QueueSource() for _ in range(num)]
    return ChoiceStreams([WorkerStream("w", delta(f"{i}:a"), s) for i, s in enumerate(sources)]), sources


def test_events_are_merged_with_their_index_in_each_stream_s_order() -> None:
    async def scenario() -> list[tuple[int, str, str]]:
        choices, sources = streams(3)
        for i, source in enumerate(sources):
            source.queue.put_nowait(delta(f"{i}:b"))
            source.queue.put_nowait(GenerateEvent(type="final", finish_reason="length"))
        seen = [(index, event.type, event.text) async for index, event in choices.events()]
        await choices.aclose()
        return seen

    seen = asyncio.run(scenario())
    for i in range(3):
        assert [(t, x) for index, t, x in seen if index == i] == [
            ("delta", f"{i}:a"),
            ("delta", f"{i}:b"),
            ("final", ""),
        ]


def test_closing_mid_way_closes_every_stream_before_its_end_with_no_read_pending() -> None:
    async def scenario() -> list[QueueSource]:
        choices, sources = streams(3)
        sources[1].queue.put_nowait(GenerateEvent(type="final", finish_reason="stop"))
        events = choices.events()
        for _ in range(4):  # three first deltas and choice 1's final; choices 0 and 2 wait for more
            await anext(events)
        await asyncio.sleep(0)
        await choices.aclose()
        return sources

    sources = asyncio.run(scenario())
    assert [s.closed_before_end for s in sources] == [True, False, True]
    assert [s.num_reads_pending for s in sources] == [0, 0, 0]
