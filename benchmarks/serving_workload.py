"""A multi-adapter serving workload derived from the Azure LLM conversation trace (pure, deterministic).

Derivation (the way the multi-LoRA serving papers do it; see ../shared/data/README.md):

- a window of the trace: rows [offset, offset + n) in timestamp order (TIMESTAMP, ContextTokens,
  GeneratedTokens);
- arrival times: `poisson` draws exponential gaps at `rps` (seeded; the trace only supplies lengths), or
  `trace` keeps the window's own gaps rescaled by one factor so that its mean rate is `rps` (burstiness
  kept); the list is cut at `duration_s` and at `num_requests`;
- lengths: ContextTokens * length_scale clipped to [min_prompt_tokens, max_prompt_tokens], GeneratedTokens
  * length_scale clipped to [1, max_output_tokens], and prompt + output <= context_len;
- adapters: a power-law (Zipf) popularity p_k ~ 1 / k^alpha over the adapters; which adapter gets which
  popularity rank is a seeded shuffle (so popularity is not tied to the rank order of the files);
- prompt text: seeded random token ids of the base tokenizer, decoded and re-tokenized until the text is
  exactly `prompt_tokens` tokens once the tokenizer's own special tokens (e.g. BOS) are added, as servers do;
  `prompt_token_ids` is the same prompt tokenized with special tokens, for servers fed token ids.

Every system gets the same list. Only the standard library and `tokenizers` are used.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import random
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

NUM_SPECIAL_IDS = 7  # demo tokenizer: <unk> <s> </s> <pad> <|system|> <|user|> <|assistant|>


@dataclass(frozen=True)
class WorkloadSpec:
    trace_path: Path
    tokenizer_dir: Path  # the base model dir (tokenizer.json, config.json)
    adapters: tuple[str, ...]
    rps: float = 0.5
    arrival: str = "poisson"  # poisson | trace
    num_requests: int = 32
    duration_s: float = 60.0
    trace_offset: int = 0
    max_prompt_tokens: int = 256
    min_prompt_tokens: int = 8
    max_output_tokens: int = 64
    length_scale: float = 1.0
    zipf_alpha: float = 1.0
    context_len: int | None = None  # default: max_position_embeddings of the base model
    seed: int = 0


@dataclass
class WorkloadRequest:
    index: int
    arrival_s: float
    adapter: str
    prompt_tokens: int  # with the tokenizer's special tokens (BOS), as a server counts them
    output_tokens: int
    trace_context_tokens: int
    trace_generated_tokens: int
    prompt: str = field(repr=False, default="")
    prompt_token_ids: list[int] = field(repr=False, default_factory=list)

    def public(self) -> dict:
        d = asdict(self)
        d.pop("prompt")
        d.pop("prompt_token_ids")
        return d


def read_trace(path: Path) -> list[tuple[float, int, int]]:
    """(seconds since the first row, context tokens, generated tokens), sorted by time."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            ts = r["TIMESTAMP"].strip()
            # Python's fromisoformat takes at most 6 fractional digits; the trace has 7.
            if "." in ts:
                head, frac = ts.split(".", 1)
                ts = f"{head}.{frac[:6]}"
            t = datetime.fromisoformat(ts).timestamp()
            rows.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    rows.sort(key=lambda x: x[0])
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def zipf_weights(n: int, alpha: float) -> list[float]:
    w = [1.0 / (k**alpha) for k in range(1, n + 1)]
    s = sum(w)
    return [x / s for x in w]


def popularity_order(adapters: tuple[str, ...] | list[str], seed: int) -> list[str]:
    """Adapters by popularity rank (most popular first): a seeded shuffle, so popularity is not tied to the
    order of the names."""
    order = list(adapters)
    random.Random(seed + 2).shuffle(order)
    return order


def _arrivals(spec: WorkloadSpec, window: list[tuple[float, int, int]], rng: random.Random) -> list[float]:
    if spec.arrival == "poisson":
        out, t = [], 0.0
        for _ in window:
            t += rng.expovariate(spec.rps)
            out.append(t)
        return out
    if spec.arrival == "trace":
        base = window[0][0]
        times = [t - base for t, _, _ in window]
        span = times[-1] if times[-1] > 0 else 1.0
        trace_rate = (len(times) - 1) / span if len(times) > 1 else spec.rps
        scale = trace_rate / spec.rps  # >1 stretches the trace (lower rate), <1 compresses it
        # the first request arrives one mean gap after start, like a Poisson process would
        return [(1.0 / spec.rps) + t * scale for t in times]
    raise ValueError(f"unknown arrival mode {spec.arrival!r} (poisson | trace)")


def _load_tokenizer(tokenizer_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))


def make_prompt(tokenizer, n_content: int, rng: random.Random) -> str:
    """Text that tokenizes to exactly n_content tokens (no special tokens), from seeded random ids."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=False)
    ids = [rng.randrange(NUM_SPECIAL_IDS, vocab) for _ in range(n_content)]
    text = ""
    for _ in range(16):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        enc = tokenizer.encode(text, add_special_tokens=False).ids
        if len(enc) == n_content:
            return text
        if len(enc) > n_content:
            ids = enc[:n_content]
        else:
            ids = enc + [rng.randrange(NUM_SPECIAL_IDS, vocab) for _ in range(n_content - len(enc))]
    # fall back to trimming words until the count is at most n_content
    words = text.split(" ")
    while words and len(tokenizer.encode(" ".join(words), add_special_tokens=False).ids) > n_content:
        words.pop()
    return " ".join(words)


def build_workload(spec: WorkloadSpec) -> list[WorkloadRequest]:
    if not spec.adapters:
        raise ValueError("no adapters")
    trace = read_trace(spec.trace_path)
    limit = max(1, spec.num_requests)
    window = trace[spec.trace_offset : spec.trace_offset + limit]
    if not window:
        raise ValueError(f"trace offset {spec.trace_offset} is past the end ({len(trace)} rows)")
    arrivals = _arrivals(spec, window, random.Random(spec.seed + 1))
    context = spec.context_len
    if context is None:
        cfg = json.loads((Path(spec.tokenizer_dir) / "config.json").read_text())
        context = int(cfg.get("max_position_embeddings", 2048))
    order = popularity_order(spec.adapters, spec.seed)
    cum = list(itertools.accumulate(zipf_weights(len(order), spec.zipf_alpha)))
    tok = _load_tokenizer(spec.tokenizer_dir)
    num_special = len(tok.encode("", add_special_tokens=True).ids)  # e.g. a BOS post-processor
    pick_rng, prompt_rng = random.Random(spec.seed + 3), random.Random(spec.seed + 4)
    out: list[WorkloadRequest] = []
    for i, ((_, ctx, gen), arrival) in enumerate(zip(window, arrivals, strict=True)):
        if arrival > spec.duration_s:
            break
        p = max(spec.min_prompt_tokens, min(spec.max_prompt_tokens, round(ctx * spec.length_scale)))
        o = max(1, min(spec.max_output_tokens, round(gen * spec.length_scale)))
        p = min(p, context - o)
        u = pick_rng.random() * cum[-1]
        adapter = order[min(bisect.bisect_left(cum, u), len(order) - 1)]
        text = make_prompt(tok, p - num_special, prompt_rng)
        ids = tok.encode(text, add_special_tokens=True).ids
        out.append(
            WorkloadRequest(
                index=i,
                arrival_s=round(arrival, 6),
                adapter=adapter,
                prompt_tokens=len(ids),
                output_tokens=o,
                trace_context_tokens=ctx,
                trace_generated_tokens=gen,
                prompt=text,
                prompt_token_ids=ids,
            )
        )
    return out


def summarize(reqs: list[WorkloadRequest]) -> dict:
    """Shape of the workload (for the JSON lines)."""
    if not reqs:
        return {"num_requests": 0}
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.adapter] = counts.get(r.adapter, 0) + 1
    span = reqs[-1].arrival_s
    return {
        "num_requests": len(reqs),
        "span_s": round(span, 3),
        "offered_rps": round(len(reqs) / span, 4) if span > 0 else None,
        "prompt_tokens_mean": round(sum(r.prompt_tokens for r in reqs) / len(reqs), 1),
        "output_tokens_mean": round(sum(r.output_tokens for r in reqs) / len(reqs), 1),
        "prompt_tokens_total": sum(r.prompt_tokens for r in reqs),
        "output_tokens_total": sum(r.output_tokens for r in reqs),
        "num_distinct_adapters": len(counts),
        "adapter_counts": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
    }


if __name__ == "__main__":  # quick look: python benchmarks/serving_workload.py MODEL_DIR [N]
    import sys

    model_dir = Path(sys.argv[1]).expanduser()
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    names = tuple(sorted(p.name for p in (model_dir / "adapters").iterdir() if p.is_dir()))
    here = Path(__file__).resolve().parent
    spec = WorkloadSpec(
        trace_path=here.parent.parent / "shared/data/azure_llm_2023_conv.csv",
        tokenizer_dir=model_dir / "base",
        adapters=names,
        num_requests=n,
        duration_s=1e9,
    )
    reqs = build_workload(spec)
    for r in reqs:
        print(json.dumps(r.public()))
    print(json.dumps(summarize(reqs)))
