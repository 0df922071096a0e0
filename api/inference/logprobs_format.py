"""Logprobs in OpenAI's response shapes, from the worker's per-token `TokenLogprobs`.

Completions (legacy): `choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}`, where each
`top_logprobs` entry maps token text -> logprob for the top k alternatives plus the sampled token (as vLLM
does), and `text_offset` is each token's start in the completion text (the running length of the token texts).
With `echo`, the prompt's tokens come first, the first with a null logprob and null top_logprobs (as OpenAI).
Chat: `choices[].logprobs = {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`.
A streamed response carries each delta's tokens in its chunk; a `LogprobsFormatter` keeps the text offset
across chunks. Logprobs that are -inf (a token min_tokens or a bias ruled out) are shown as -9999.0, as vLLM
does, since JSON has no infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from api.prompting import BaseModelTokenizer
from cluster.protocol import TokenLogprobs

MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else MIN_LOGPROB


@dataclass
class LogprobsFormatter:
    """Formats one choice's logprobs, chunk by chunk or all at once (module doc for the shapes)."""

    kind: Literal["text", "chat"]
    tokenizer: BaseModelTokenizer
    text_offset: int = 0

    def format(
        self, logprobs: list[TokenLogprobs], echo: tuple[list[int], list[TokenLogprobs | None]] | None = None
    ) -> dict[str, Any]:
        """The `logprobs` object of a choice for these tokens (the next ones after those already formatted);
        `echo` (completions): the prompt's token ids and logprobs, shown first (None: no logprob, the first)."""
        if self.kind == "chat":
            return self._chat(logprobs)
        prompt_ids, prompt_logprobs = echo if echo is not None else ([], [])
        items = [*zip(prompt_ids, prompt_logprobs), *((lp.token_id, lp) for lp in logprobs)]
        return self._completion(items)

    def _completion(self, items: list[tuple[int, TokenLogprobs | None]]) -> dict[str, Any]:
        text = self.tokenizer.token_text
        tokens, offsets = [], []
        for token_id, _ in items:
            token = text(token_id)
            tokens.append(token)
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [None if lp is None else _finite(lp.logprob) for _, lp in items],
            "top_logprobs": [None if lp is None else self._top_map(lp) for _, lp in items],
            "text_offset": offsets,
        }

    def _top_map(self, lp: TokenLogprobs) -> dict[str, float]:
        text = self.tokenizer.token_text
        return {text(t): _finite(v) for t, v in lp.top} | {text(lp.token_id): _finite(lp.logprob)}

    def _chat(self, logprobs: list[TokenLogprobs]) -> dict[str, Any]:
        return {
            "content": [
                self._chat_token(lp.token_id, lp.logprob)
                | {"top_logprobs": [self._chat_token(t, v) for t, v in lp.top]}
                for lp in logprobs
            ]
        }

    def _chat_token(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.tokenizer.token_text(token_id)
        return {"token": token, "logprob": _finite(logprob), "bytes": list(token.encode("utf-8"))}
