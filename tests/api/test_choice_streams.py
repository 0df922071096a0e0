"""ChoiceStreams (api/inference/choice_streams.py): the events of n worker streams merged with their choice
index, each stream's order kept; closing it mid-way closes every stream before its end (which aborts the
engine requests) with no read left pending; choices handed over to open are opened only once read, one that
cannot start reads as its error event, and closing cancels an opening still under way."""

from __future__ import annotations

import asyncio

from api.inference.choice_streams import ChoiceStreams
from api.worker_client import WorkerStream, WorkerUnavailableError
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


def test_choices_to_open_open_once_read_and_one_that_cannot_start_reads_as_its_error() -> None:
    async def scenario() -> tuple[list[str], list[tuple[int, str, str | None]], list[QueueSource]]:
        calls: list[str] = []
        opened = QueueSource()
        opened.queue.put_nowait(GenerateEvent(type="final", finish_reason="length"))

        async def open_one() -> WorkerStream:
            calls.append("open 1")
            return WorkerStream("w", delta("1:a"), opened)

        async def refuse() -> WorkerStream:
            calls.append("open 2")
            raise WorkerUnavailableError("worker w answered 503: draining")

        first = QueueSource()
        choices = ChoiceStreams([WorkerStream("w", delta("0:a"), first)], openers=[open_one, refuse])
        assert choices.num_choices == 3 and calls == []  # nothing opens before the events are read
        seen = []
        async for index, event in choices.events():
            seen.append((index, event.type, event.text or event.message))
            if len(seen) == 4:
                break
        await choices.aclose()
        return calls, seen, [first, opened]

    calls, seen, sources = asyncio.run(scenario())
    assert sorted(calls) == ["open 1", "open 2"]
    assert sorted(seen, key=lambda s: (s[0], s[1] != "delta")) == [
        (0, "delta", "0:a"),
        (1, "delta", "1:a"),
        (1, "final", None),
        (2, "error", "choice 2 could not start: worker w answered 503: draining"),
    ]
    assert [s.closed_before_end for s in sources] == [True, False]  # choice 0 aborted; choice 1 had ended


def test_closing_while_a_choice_opens_cancels_the_opening() -> None:
    async def scenario() -> list[str]:
        steps: list[str] = []
        is_opening = asyncio.Event()

        async def never_answers() -> WorkerStream:
            steps.append("opening")
            is_opening.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                steps.append("cancelled")
                raise
            raise AssertionError("unreachable")

        first = QueueSource()
        choices = ChoiceStreams([WorkerStream("w", delta("0:a"), first)], openers=[never_answers])
        events = choices.events()
        assert (await anext(events))[0] == 0
        await is_opening.wait()
        await choices.aclose()
        steps.append(f"choice 0 closed before its end: {first.closed_before_end}")
        return steps

    assert asyncio.run(scenario()) == ["opening", "cancelled", "choice 0 closed before its end: True"]
