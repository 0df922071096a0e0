"""The trace workload the benchmarks share, from their command-line flags: the flags (--max-prompt-tokens,
--max-output-tokens, --length-scale, --zipf-alpha, --trace, --trace-offset) and the WorkloadSpec of
benchmarks/serving_workload.py they describe, with --num-requests and --seed (pure, no I/O).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from serving_workload import WorkloadSpec

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "azure_llm_2023_conv.csv"
OPEN_ENDED_S = 1e9  # an arrival window no workload reaches: --num-requests alone cuts the list


def add_workload_args(
    p: argparse.ArgumentParser,
    *,
    max_prompt_tokens: int,
    max_output_tokens: int,
    length_scale: float,
    helps: dict[str, str] | None = None,
) -> None:
    """The trace workload flags with this benchmark's defaults; `helps` gives a flag (by dest) its help."""
    helps = helps or {}
    p.add_argument(
        "--max-prompt-tokens", type=int, default=max_prompt_tokens, help=helps.get("max_prompt_tokens")
    )
    p.add_argument(
        "--max-output-tokens", type=int, default=max_output_tokens, help=helps.get("max_output_tokens")
    )
    p.add_argument("--length-scale", type=float, default=length_scale, help=helps.get("length_scale"))
    p.add_argument("--zipf-alpha", type=float, default=1.0, help=helps.get("zipf_alpha"))
    p.add_argument("--trace", type=Path, default=TRACE, help=helps.get("trace"))
    p.add_argument("--trace-offset", type=int, default=0, help=helps.get("trace_offset"))


def workload_spec(
    args: argparse.Namespace,
    *,
    trace_path: Path,
    tokenizer_dir: Path,
    adapters: tuple[str, ...],
    rps: float,
    **fields: Any,
) -> WorkloadSpec:
    """The WorkloadSpec of a benchmark's workload flags at `rps`; `fields` sets any other WorkloadSpec field
    (default duration_s: open-ended)."""
    return WorkloadSpec(
        trace_path=trace_path,
        tokenizer_dir=tokenizer_dir,
        adapters=adapters,
        rps=rps,
        num_requests=args.num_requests,
        trace_offset=args.trace_offset,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        length_scale=args.length_scale,
        zipf_alpha=args.zipf_alpha,
        seed=args.seed,
        **{"duration_s": OPEN_ENDED_S, **fields},
    )
