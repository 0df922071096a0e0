"""The systems engine_throughput.py compares: one peer script per (system, mode) in its own process, its
result line with peak memory and the machine's other load, and the decode floor line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_dtype import ENV_NAME
from child_process import ChildClock, busy_cores, child_env, wait_with_timeout
from process_memory import TreeMemorySampler
from vllm_peer import set_omp_bind

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = HERE / "peers"


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
    env[ENV_NAME] = args.dtype  # the peers read it (the vLLM venv cannot import the engine's resolver)
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
        args.dtype,
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
