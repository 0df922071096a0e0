"""Logprobs in OpenAI's response shapes, from the worker's per-token `TokenLogprobs`.

Completions (legacy): `choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}`, where each
`top_logprobs` entry maps token text -> logprob for the top k alternatives plus the sampled token (as vLLM
does), and `text_offset` is each token's start in the completion text (the running length of the token texts).
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

    def format(self, logprobs: list[TokenLogprobs]) -> dict[str, Any]:
        """The `logprobs` object of a choice for these tokens (the next ones after those already formatted)."""
        return self._completion(logprobs) if self.kind == "text" else self._chat(logprobs)

    def _completion(self, logprobs: list[TokenLogprobs]) -> dict[str, Any]:
        text = self.tokenizer.token_text
        tokens, offsets = [], []
        for lp in logprobs:
            token = text(lp.token_id)
            tokens.append(token)
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        top = [
            {text(t): _finite(v) for t, v in lp.top} | {text(lp.token_id): _finite(lp.logprob)}
            for lp in logprobs
        ]
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(lp.logprob) for lp in logprobs],
            "top_logprobs": top,
            "text_offset": offsets,
        }

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
