"""`n` choices end to end over real HTTP (tests/api/test_completions_e2e.py's stack: uvicorn, a worker process
with the tiny model, the NDJSON worker protocol): the official `openai` client against an adapter, streamed and
not, with another tenant's requests in flight, and a client leaving an n=2 stream."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from tests.api.test_completions_e2e import Stack, rows_of, stack  # noqa: F401 - the module's stack fixture
from tests.polling import wait_for

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "hi"}]


def test_openai_client_n_against_an_adapter_beside_another_tenant(
    stack: Stack,  # noqa: F811
    adapter_dirs: dict[str, Path],
) -> None:
    key, other = stack.tenant("e2e-n"), stack.tenant("e2e-n-other")
    stack.upload(key, "multi", adapter_dirs["adapter-00"])
    stack.upload(other, "theirs", adapter_dirs["adapter-01"])
    client, other_client = stack.openai(key), stack.openai(other)
    others_done = threading.Event()

    def others() -> None:
        for _ in range(3):
            other_client.completions.create(model="theirs", prompt="another prompt", max_tokens=12)
        others_done.set()

    thread = threading.Thread(target=others)
    thread.start()
    exact = {"ignore_eos": True}  # every choice runs to max_tokens: the counts below are exact
    plain = client.completions.create(
        model="multi", prompt="hello world", n=3, max_tokens=5, seed=4, extra_body=exact
    )
    chat_chunks = list(
        client.chat.completions.create(
            model="multi",
            messages=MESSAGES,
            n=2,
            max_tokens=4,
            seed=8,
            extra_body=exact,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    thread.join()
    assert others_done.is_set()
    assert [c.index for c in plain.choices] == [0, 1, 2]
    assert plain.usage is not None and plain.usage.completion_tokens == 3 * 5
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chat_chunks if c.choices}
    assert set(finishes) == {0, 1}
    usage = chat_chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 2 * 4
    rows = rows_of(stack, key)
    assert [r.status for r in rows] == ["ok", "ok"]
    assert (rows[0].prompt_tokens, rows[0].completion_tokens) == (
        plain.usage.prompt_tokens,
        plain.usage.completion_tokens,
    )
    assert (rows[1].prompt_tokens, rows[1].completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    again = client.completions.create(
        model="multi", prompt="hello world", n=3, max_tokens=5, seed=4, extra_body=exact
    )
    assert [c.text for c in again.choices] == [c.text for c in plain.choices]


def test_a_client_leaving_an_n_stream_aborts_every_choice_and_is_billed_once(stack: Stack) -> None:  # noqa: F811
    key = stack.tenant("e2e-n-leaver")
    body = {"model": "lorahost-base", "prompt": "hello world", "max_tokens": 400, "n": 2, "stream": True}
    body |= {"ignore_eos": True, "seed": 3}
    num_read = 0
    with (
        httpx.Client(timeout=60) as http,
        http.stream(
            "POST", f"{stack.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            num_read += line.startswith("data: {")
            if num_read == 6:
                break
    assert wait_for(lambda: [r.status for r in rows_of(stack, key)] not in ([], ["in_progress"]))
    [row] = rows_of(stack, key)
    assert row.status == "aborted", row.error_message
    assert 6 <= row.completion_tokens < 800 and row.prompt_tokens > 0
    assert wait_for(lambda: stack.directory.list_live()[0].scheduler.num_running == 0), (
        "a choice still runs on the worker"
    )
