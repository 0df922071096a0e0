"""Token masks of the constrained rows of a step (structured outputs, issue 37 item 3): one llguidance matcher
per request, kept while the request lives, and the mask of every constrained sampling row applied to its
logits before sampling (a disallowed token's logit becomes -inf, so greedy, top-k/top-p and seeded sampling
all pick among allowed tokens, and logprobs are those of the constrained distribution).

Matchers advance lazily: before each mask a row's matcher consumes the output tokens it has not seen yet
(`Sequence.output_token_ids` is the truth). So a preempted and recomputed sequence (its outputs kept) resumes
where it was, and one whose matcher was dropped replays all its outputs into a fresh copy. A finished or
aborted request frees its matcher (`release`). Once the grammar is complete only the end-of-sequence tokens
are allowed, so the row ends with finish_reason "stop"; a matcher that broke (never expected) allows only
them too, ending the row rather than sampling outside its grammar.

Overlap: `start` computes the step's masks on a thread while the model runs (llguidance drops the GIL while
it computes a mask); `apply` waits for them after the logits. The thread reads only the rows' token ids,
which no one changes during a step (the core appends the sampled tokens after `run_step` returns).
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_workers.engine.thread_limits import limit_this_thread
from registry.grammars import GrammarCache, GrammarTokenizer, grammar_tokenizer
from scheduler.core.sequence import BatchEntry, Sequence
from scheduler.core.structured_output import StructuredOutput


@dataclass
class _Row:
    matcher: Any  # llguidance.LLMatcher
    num_consumed: int  # output tokens the matcher has consumed


@dataclass(frozen=True)
class StepMasks:
    """The allowed-token masks of one step: `rows` index the step's sampling entries; `bitmask` [len(rows),
    ceil(vocab / 32)] int32, bit j of word w allows token 32 w + j."""

    rows: list[int]
    bitmask: torch.Tensor


class StructuredRows:
    """Per-request matchers and per-step masks for one model (module doc). The tokenizer is read on first use
    from the model directory's tokenizer.json (engines that never see a constraint never pay for it)."""

    def __init__(
        self,
        model_path: Path,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        cache: GrammarCache | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.cache = cache if cache is not None else GrammarCache()
        self._tokenizer: GrammarTokenizer | None = None
        self._rows: dict[str, _Row] = {}
        self._thread: ThreadPoolExecutor | None = None

    @property
    def tokenizer(self) -> GrammarTokenizer:
        """The model's tokenizer as the grammar library reads it (built once)."""
        if self._tokenizer is None:
            text = (self.model_path / "tokenizer.json").read_text()
            eos = list(self.eos_token_ids) or _tokenizer_config_eos(self.model_path, text)
            self._tokenizer = grammar_tokenizer(text, self.vocab_size, eos)
        return self._tokenizer

    def check(self, structured: StructuredOutput) -> None:
        """Compile the constraint (into the cache); GrammarError naming the problem when it is unusable."""
        self.cache.matcher(structured, self.tokenizer)

    def start(self, sampling: list[BatchEntry]) -> Future[StepMasks] | None:
        """Begin computing the masks of the constrained rows among a step's sampling entries (None: none)."""
        rows = [(i, e.seq) for i, e in enumerate(sampling) if e.seq.sampling_params.structured_output]
        if not rows:
            return None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(
                1, thread_name_prefix="grammar-masks", initializer=limit_this_thread, initargs=(1,)
            )
        return self._thread.submit(self.masks, rows)

    def masks(self, rows: list[tuple[int, Sequence]]) -> StepMasks:
        """The masks of (sampling row, sequence) pairs, each matcher first caught up with its outputs."""
        bitmask = torch.zeros((len(rows), (self.vocab_size + 31) // 32), dtype=torch.int32)
        for k, (_, seq) in enumerate(rows):
            row = bitmask[k]
            try:
                is_ok = self._fill(row, seq)
            except Exception:  # noqa: BLE001 (one row's grammar must not fail its batch neighbours' step)
                is_ok = False
            if not is_ok:
                row.zero_()
                _allow(row, self.tokenizer.eos_token_ids)
        return StepMasks([i for i, _ in rows], bitmask)

    def _fill(self, row: torch.Tensor, seq: Sequence) -> bool:
        """Write the sequence's mask into `row`; False when its matcher broke (the row then only ends)."""
        matcher = self._caught_up(seq)
        if matcher is None:
            return False
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        return not matcher.is_error()

    def _caught_up(self, seq: Sequence) -> Any | None:
        """The request's matcher after consuming its unseen outputs (replayed from the start when it has none
        or has seen more than the sequence now holds); None when an output broke the grammar."""
        outputs = seq.output_token_ids
        row = self._rows.get(seq.request_id)
        if row is None or row.num_consumed > len(outputs):
            structured = seq.sampling_params.structured_output
            assert structured is not None
            row = _Row(self.cache.matcher(structured, self.tokenizer), 0)
            self._rows[seq.request_id] = row
        if row.num_consumed < len(outputs):
            is_ok = row.matcher.consume_tokens(outputs[row.num_consumed :])
            row.num_consumed = len(outputs)
            if not is_ok:
                return None
        return row.matcher

    def release(self, request_id: str) -> None:
        """Drop a finished or aborted request's matcher."""
        self._rows.pop(request_id, None)

    @property
    def num_live(self) -> int:
        """Requests holding a matcher."""
        return len(self._rows)


def apply_masks(logits: torch.Tensor, masks: StepMasks) -> None:
    """Set the disallowed tokens' logits of the masked rows to -inf, in place. logits: [num_sampling, vocab]."""
    vocab = logits.shape[-1]
    # bit j of int32 word w (little-endian bytes) is token 32 w + j: unpack the bytes' bits low bit first
    bits = np.unpackbits(masks.bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
    disallowed = torch.from_numpy(bits[:, :vocab] == 0).to(logits.device, non_blocking=True)
    if len(masks.rows) == logits.shape[0]:
        logits.masked_fill_(disallowed, float("-inf"))
        return
    for k, row in enumerate(masks.rows):  # in place, row by row: no gathered copy of the masked rows
        logits[row].masked_fill_(disallowed[k], float("-inf"))


def _allow(row: torch.Tensor, token_ids: tuple[int, ...]) -> None:
    for token in token_ids:
        row[token // 32] |= _bit(token % 32)


def _bit(j: int) -> int:
    return -(1 << 31) if j == 31 else 1 << j  # int32: bit 31 is the sign bit


def _tokenizer_config_eos(model_path: Path, tokenizer_json: str) -> list[int]:
    """The end-of-sequence id named by tokenizer_config.json (when config.json names none)."""
    path = model_path / "tokenizer_config.json"
    eos = json.loads(path.read_text()).get("eos_token") if path.is_file() else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    vocab = {t["content"]: t["id"] for t in json.loads(tokenizer_json).get("added_tokens", [])}
    return [vocab[eos]] if eos in vocab else []
