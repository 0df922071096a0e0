"""TokenLines: a plain token chunk spliced into its choice's layout is the chunk `sse_line` writes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from api.inference.prepare import Kind, Prepared
from api.inference.respond import TokenLines, _choice, _envelope, sse_line
from cluster.protocol import GenerateRequest
from scheduler.routing.router import RouteRequest


def _prepared(kind: Kind, *, include_usage: bool, model: str = 'acme/a "quoted" é') -> Prepared:
    return Prepared(
        kind=kind,
        response_id="chatcmpl-0123",
        model=model,
        is_stream=True,
        include_usage=include_usage,
        route=RouteRequest("base", "acme/a", 10, 4),
        generate=GenerateRequest(request_id="r1", prompt_token_ids=[1, 2]),
        num_choices=3,
    )


@given(
    kind=st.sampled_from(["chat", "text"]),
    include_usage=st.booleans(),
    model=st.sampled_from(['acme/a "quoted" é', "\x00text\x00", "a\x00text\x00b"]),
    index=st.integers(0, 2),
    texts=st.lists(st.text(), min_size=1, max_size=4),
)
def test_a_token_line_is_the_chunk_sse_line_writes(
    kind: Kind, include_usage: bool, model: str, index: int, texts: list[str]
) -> None:
    # a model name holding the layout's own mark must not move where the text goes
    prepared = _prepared(kind, include_usage=include_usage, model=model)
    usage_field: dict[str, None] = {"usage": None} if include_usage else {}
    lines = TokenLines(prepared, usage_field)
    for text in texts:  # a choice's layout is made once and reused
        choice = _choice(kind, text, None, is_chunk=True, index=index, has_content=True)
        expected = sse_line(_envelope(prepared, [choice], is_chunk=True) | usage_field)
        line = lines.line(index, text)
        assert line == expected
        chunk = json.loads(line.removeprefix(b"data: ").removesuffix(b"\n\n"))
        content = chunk["choices"][0]["text"] if kind == "text" else chunk["choices"][0]["delta"]["content"]
        assert content == text and chunk["created"] == prepared.created
