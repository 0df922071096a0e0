"""The trace workload the benchmarks share, from their command-line flags: the WorkloadSpec of
benchmarks/serving_workload.py built from --trace-offset, --max-prompt-tokens, --max-output-tokens,
--length-scale, --zipf-alpha, --num-requests and --seed (pure, no I/O).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from serving_workload import WorkloadSpec

OPEN_ENDED_S = 1e9  # an arrival window no workload reaches: --num-requests alone cuts the list


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
