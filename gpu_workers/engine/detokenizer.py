"""Incremental detokenization (prefix/read offsets, as in vLLM) and stop-string handling."""

from __future__ import annotations

from typing import Any

from scheduler.core.sequence import Sequence


def append_text(tokenizer: Any, seq: Sequence) -> None:
    """Extend seq.output_text with the text of its newest output token(s).

    Decodes only a short window [prefix_offset, end) so each step is O(1) in the output length; waits while
    the window ends in an incomplete UTF-8 sequence (U+FFFD).
    """
    ids = seq.output_token_ids
    prefix_offset, read_offset = seq.detok_offsets
    prefix_text = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens=True)
    new_text = tokenizer.decode(ids[prefix_offset:], skip_special_tokens=True)
    if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
        seq.output_text += new_text[len(prefix_text) :]
        seq.detok_offsets = (read_offset, len(ids))


def find_stop_string(text: str, stop: tuple[str, ...], num_new_chars: int) -> int | None:
    """Index where the earliest stop string starts, looking only where the newest chars could complete one."""
    if not stop:
        return None
    search_from = max(0, len(text) - num_new_chars - max(len(s) for s in stop) + 1)
    hits = [i for i in (text.find(s, search_from) for s in stop) if i >= 0]
    return min(hits) if hits else None


def num_held_back_chars(stop: tuple[str, ...]) -> int:
    """Chars kept back while streaming so a partial stop string is never emitted."""
    return max((len(s) for s in stop), default=1) - 1
