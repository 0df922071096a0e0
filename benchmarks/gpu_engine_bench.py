"""lorahost on a GPU at a realistic size: an 8B-shaped Llama and the `small` demo model, each with 16, 64 and 256
LoRA adapters (ranks 8..128, all seven projections), lorahost vs transformers (+ peft) on the same random
weights, against the HBM floor of a decode step. One table, one JSON file.

    python benchmarks/gpu_engine_bench.py --out benchmarks/results/gpu_engine.json      # on a CUDA machine
    python benchmarks/gpu_engine_bench.py --smoke                                       # CPU, tiny, seconds
    bash benchmarks/gpu_check.sh gpu_engine                                             # on a lent GPU

Nothing is downloaded or read from disk: every peer makes the model and the adapters on the device from one
seeded generator (benchmarks/random_weights.py), so both systems run the same weights and the same adapters,
and the 8B-shaped model's 16 GB is never written. The workload and the adapter sets are in
benchmarks/gpu_engine_workload.py, the columns in benchmarks/gpu_engine_report.py.

Order: the card's copy bandwidth, then per model (small first) a lorahost peer and a transformers peer, each
its own process (its GPU memory freed when it exits), each with a time limit: a share of what is left of
--time-limit (small model 10% / 15%, 8B 30% / 45%, lorahost / transformers; what a peer leaves goes to the
next). A peer prints a row at a time, so a peer stopped at its limit keeps the rows it finished; the table says
why a row is missing. Memory: lorahost holds the model, every adapter of the largest set and twice the batch's
KV (8B: 16.1 GB + 35.0 GB + 1.2 GB); transformers holds the model and the adapters its batches use (<= batch: 7.9 GB on the 8B).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from child_process import child_env, wait_with_timeout
from decode_floor import measure_copy_bandwidth, measure_read_bandwidth
from gpu_engine_report import adapter_sets, build_rows, format_table, kernel_choices, planned_rows
from gpu_engine_workload import SHAPES, SYSTEMS, adapter_counts
from run_info import device_name, git_state

PEERS = {"lorahost": HERE / "peers" / "gpu_lorahost.py", "hf": HERE / "peers" / "gpu_hf_peft.py"}
# Relative time shares of the peers (what each is expected to take on an H100 with today's engine).
MODEL_WEIGHT = {"8b": 3.0, "small": 1.0, "tiny": 1.0}
SYSTEM_WEIGHT = {"lorahost": 1.0, "hf": 1.5}
SMOKE = {
    "models": "tiny",
    "adapter_counts": "2,8",
    "batch": 4,
    "prompt_len": 8,
    "max_tokens": 4,
    "warmup_tokens": 2,
    "repeats": 1,
    "device": "cpu",
    "dtype": "float32",
    "bandwidth_mb": 64,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="small,8b", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--adapter-counts", default="16,64,256")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of lorahost, hf")
    p.add_argument("--batch", type=int, default=32, help="requests in the batch (all admitted at once)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup-tokens", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="most timed runs per row")
    p.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA), bfloat16, float16 or float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--bandwidth-mb", type=int, default=2048, help="bytes of the bandwidth test's tensor (MiB)"
    )
    p.add_argument("--time-limit", type=float, default=450.0, help="seconds for every peer together")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/lorahost-gpu-engine"))
    p.add_argument("--out", type=Path, default=HERE / "results" / "gpu_engine.json")
    p.add_argument("--smoke", action="store_true", help="the same code on the CPU: tiny model, seconds")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    return args


def measure_bandwidth(device: str, num_bytes: int) -> tuple[float, str, str]:
    """(bytes/s, how it was measured, the device's name) on the device the peers will use."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return measure_copy_bandwidth(num_bytes), "device-to-device copy (CUDA events)", device_name("cuda")
    return measure_read_bandwidth(0, num_bytes), "read (sum of an fp32 tensor)", device_name("cpu")


def peer_command(args: argparse.Namespace, model: str, system: str, max_row_s: float) -> list[str]:
    """The peer's command line for this run's workload."""
    return [
        sys.executable,
        str(PEERS[system]),
        *("--model", model, "--adapter-counts", ",".join(map(str, args.counts))),
        *("--batch", str(args.batch), "--prompt-len", str(args.prompt_len)),
        *("--max-tokens", str(args.max_tokens), "--warmup-tokens", str(args.warmup_tokens)),
        *("--repeats", str(args.repeats), "--max-row-s", f"{max_row_s:.0f}"),
        *("--device", args.device, "--dtype", args.dtype, "--seed", str(args.seed)),
        *("--work-dir", str(args.work_dir)),
    ]


def run_peer(cmd: list[str], timeout_s: float, log_path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Run a peer until it exits or `timeout_s` passes: (its result lines, None or why it stopped early)."""
    lines: list[dict[str, Any]] = []
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=str(REPO), env=child_env(), stdout=subprocess.PIPE, stderr=log, text=True
        )

        def pump() -> None:
            for text in proc.stdout:  # type: ignore[union-attr]
                log.write(text)
                log.flush()
                if text.startswith('{"system"'):
                    lines.append(json.loads(text))
                    print(f"[gpu_engine] {text.strip()[:240]}", file=sys.stderr, flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        _, _, timed_out = wait_with_timeout(proc, timeout_s)
        reader.join(timeout=10)
    if timed_out:
        return lines, f"time limit {timeout_s:.0f}s"
    if proc.returncode:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        return lines, f"exit {proc.returncode}: {tail[0][:160] if tail else '?'}"
    return lines, None


def run_peers(
    args: argparse.Namespace, log_dir: Path
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], str]]:
    """Every (model, system) peer in turn, each with its share of the time left (module doc)."""
    jobs = [(m, s) for m in args.model_list for s in args.system_list]
    weights = [MODEL_WEIGHT.get(m, 1.0) * SYSTEM_WEIGHT[s] for m, s in jobs]
    deadline = time.monotonic() + args.time_limit
    lines: list[dict[str, Any]] = []
    errors: dict[tuple[str, str], str] = {}
    for i, (model, system) in enumerate(jobs):
        allowance = max(0.0, deadline - time.monotonic()) * weights[i] / sum(weights[i:])
        if allowance < 5:
            errors[(model, system)] = "no time left"
            continue
        max_row_s = allowance / (2 * (len(args.counts) + 1))
        print(f"[gpu_engine] {model} / {system}: up to {allowance:.0f}s", file=sys.stderr, flush=True)
        cmd = peer_command(args, model, system, max_row_s)
        found, error = run_peer(cmd, allowance, log_dir / f"{model}-{system}.log")
        lines += found
        if error is not None:
            errors[(model, system)] = error
    return lines, errors


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.model_list = [m for m in args.models.split(",") if m]
    args.system_list = [s for s in args.systems.split(",") if s]
    args.counts = sorted(adapter_counts(args.adapter_counts))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log_dir = args.out.parent / (args.out.stem + "-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    bandwidth, how, card = measure_bandwidth(args.device, args.bandwidth_mb << 20)
    print(f"[gpu_engine] {card}: {bandwidth / 1e9:,.0f} GB/s ({how})", file=sys.stderr, flush=True)
    lines, errors = run_peers(args, log_dir)
    workload = {
        k: getattr(args, k) for k in ("batch", "prompt_len", "max_tokens", "warmup_tokens", "repeats")
    }
    rows = build_rows(
        lines, planned_rows(args.model_list, args.counts, args.system_list), workload, bandwidth, errors
    )
    dtype_bytes = 4 if args.dtype == "float32" else 2
    report = {
        "card": card,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_measured_by": how,
        "workload": {**workload, "models": args.model_list, "adapter_counts": args.counts, "seed": args.seed},
        "adapter_set_bytes": adapter_sets(args.model_list, args.counts, dtype_bytes),
        "kernel_choices": kernel_choices(lines),
        "rows": rows,
        "errors": {f"{m}/{s}": e for (m, s), e in errors.items()},
        "elapsed_s": round(time.monotonic() - started, 1),
        **git_state(),
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(
        f"gpu_engine on {card}: batch {args.batch} x {args.prompt_len} prompt tokens, {args.max_tokens} out (greedy); "
        f"floor at {bandwidth / 1e9:,.0f} GB/s ({how})"
    )
    print(format_table(rows))
    for model, choice in report["kernel_choices"].items():
        print(f"lorahost kernels ({model}): {choice['forms']} ({choice['sources'] or 'no choice measured'})")
    for model, sets in report["adapter_set_bytes"].items():
        print(f"adapter sets ({model}): " + ", ".join(f"{n}: {b / 1e9:.2f} GB" for n, b in sets.items()))
    print(f"JSON: {args.out}; peer logs: {log_dir}; {report['elapsed_s']}s")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
