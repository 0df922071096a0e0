"""lorahost native engine peer for benchmarks/engine_throughput.py. Run with the project venv.

Modes:
  base  the base model only (no adapter on any request).
  lora  every adapter loaded with engine.load_adapter; request i uses adapter i, all in one batch.

When the engine exposes add_request/step (the vLLM-shaped loop), the timed run drives it step by step and
reports prefill (steps until every request has its first token) and decode step times; otherwise it times
engine.generate as a whole. engine.engine_stats().to_dict() is attached when present. Prints one JSON line.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def _jsonable(obj, depth: int = 0):
    if depth > 4:
        return str(obj)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in obj][:64]
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _jsonable(getattr(obj, k), depth + 1) for k in obj.__dataclass_fields__}
    return str(obj)


KERNEL_FORM_FIELDS = ("linear_weights", "prefill_gemm", "decode_attention", "decode_lora_form")


def forced_kernel_forms(fields: Iterable[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """EngineConfig field -> form for the kernel forms forced with LORAHOST_ENGINE_<FIELD> (as the worker's
    settings), among the config's `fields`."""
    forced = {}
    for name in KERNEL_FORM_FIELDS:
        value = environ.get(f"LORAHOST_ENGINE_{name.upper()}")
        if value and name in fields:
            forced[name] = value
    return forced


def run_engine_steps(
    engine: Any,
    prompts: list[list[int]],
    adapter_ids: list[str] | None,
    params: Any,
    tag: str,
    max_steps: int,
) -> dict:
    """Add one request per prompt (request i on adapter_ids[i]) and step the engine until all finished:
    total_s, prefill_s and prefill_steps (steps until every request has its first token), decode_step_s (the
    later steps), tokens (per request)."""
    rid_index = {}
    for i, prompt in enumerate(prompts):
        rid = f"{tag}-{i}"
        rid_index[rid] = i
        aid = adapter_ids[i] if adapter_ids else None
        engine.add_request(engine.make_request(rid, prompt, params, aid))
    tokens: list[list[int]] = [[] for _ in prompts]
    step_t: list[float] = []
    prefill_steps = 0
    t0 = time.perf_counter()
    prev = t0
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        step_t.append(now - prev)
        prev = now
        for o in outs:
            index = rid_index.get(o.request_id)
            if index is not None:
                tokens[index].extend(o.new_token_ids)
        if prefill_steps == 0 and all(tokens):
            prefill_steps = len(step_t)
        if len(step_t) > max_steps:
            raise SystemExit("engine did not finish the requests")
    return {
        "total_s": time.perf_counter() - t0,
        "prefill_s": sum(step_t[:prefill_steps]),
        "prefill_steps": prefill_steps,
        "decode_step_s": step_t[prefill_steps:],
        "tokens": tokens,
    }


def main() -> None:
    p = common.peer_argparser(__doc__.splitlines()[0], ["base", "lora"])
    p.add_argument(
        "--mode-loop",
        choices=["auto", "step", "generate"],
        default="auto",
        help="drive add_request/step (auto when available) or call generate()",
    )
    args = p.parse_args()
    t_load0 = time.perf_counter()
    import torch

    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine
    from scheduler.core.sampling import SamplingParams

    common.set_threads(args.threads)
    # LORAHOST_BENCH_DTYPE (engine_throughput.py sets it); unset: the engine's auto dtype for this CPU
    cfg_kw = {
        "model_path": args.model_dir / "base",
        "dtype": os.environ.get("LORAHOST_BENCH_DTYPE") or "auto",
    }
    fields = getattr(EngineConfig, "model_fields", None) or getattr(EngineConfig, "__dataclass_fields__", {})
    if "enable_prefix_caching" in fields:
        # Warm-up and timed runs replay the same prompts: with the prefix cache on, the timed prefill would be a
        # cache hit and measure the cache, not the engine (LORAHOST_BENCH_PREFIX_CACHING=1 to measure that).
        cfg_kw["enable_prefix_caching"] = os.environ.get("LORAHOST_BENCH_PREFIX_CACHING", "0") == "1"
    if "max_num_seqs" in fields:
        cfg_kw["max_num_seqs"] = max(64, args.num_requests)
    if "max_num_batched_tokens" in fields:
        cfg_kw["max_num_batched_tokens"] = max(4096, args.num_requests * (args.prompt_len + args.max_tokens))
    if args.threads and "num_threads" in fields:
        cfg_kw["num_threads"] = args.threads
    cfg_kw.update(forced_kernel_forms(fields))  # forced kernel forms, as the worker's
    config = EngineConfig(**cfg_kw)
    engine = LLMEngine(config)

    names = common.adapter_names(args.model_dir, args.num_requests)
    distinct = sorted(set(names))
    if args.mode == "lora":
        for n in distinct:
            engine.load_adapter(n, str(args.model_dir / "adapters" / n))
    load_s = time.perf_counter() - t_load0
    adapter_ids = names if args.mode == "lora" else None

    prompts = common.make_prompts(common.vocab_size(args.model_dir), args.num_requests, args.prompt_len)

    def params(n: int) -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    gen_sig = inspect.signature(engine.generate)

    def run_generate(n: int) -> tuple[float, list[list[int]]]:
        kw = {}
        if "adapter_ids" in gen_sig.parameters:
            kw["adapter_ids"] = adapter_ids
        elif adapter_ids is not None:
            raise SystemExit("engine.generate has no adapter_ids parameter")
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params(n), **kw)
        total = time.perf_counter() - t0
        return total, [list(o.token_ids) for o in outs]

    use_step = args.mode_loop == "step" or (
        args.mode_loop == "auto" and hasattr(engine, "add_request") and hasattr(engine, "step")
    )

    def run_steps(n: int, tag: str) -> dict:
        return run_engine_steps(engine, prompts, adapter_ids, params(n), tag, 100 * (n + args.prompt_len))

    # Warm-up: same prompts and adapters, few output tokens.
    if use_step:
        run_steps(args.warmup_tokens, "warmup")
    else:
        run_generate(args.warmup_tokens)

    runs = []
    first_tokens = None
    for r in range(args.repeats):
        if use_step:
            run = run_steps(args.max_tokens, f"bench{r}")
            toks = run.pop("tokens")
        else:
            total, toks = run_generate(args.max_tokens)
            run = {"total_s": total}
        assert all(len(t) == args.max_tokens for t in toks), [len(t) for t in toks]
        first_tokens = [t[:8] for t in toks[:2]]
        runs.append(run)

    extra = {}
    if hasattr(engine, "engine_stats"):
        try:
            extra["engine_stats"] = _jsonable(engine.engine_stats().to_dict())  # the flat JSON export
        except Exception as exc:  # noqa: BLE001
            extra["engine_stats"] = f"engine_stats() failed: {exc!r}"
    summary = common.summarize_runs(runs, args.num_requests * args.max_tokens)
    summary.pop("engine_stats", None)
    res = common.base_result(
        "lorahost",
        args.mode,
        args,
        engine="lorahost native",
        adapters=len(distinct) if args.mode == "lora" else 0,
        loop="step" if use_step else "generate",
        torch_threads=torch.get_num_threads(),
        device=str(config.resolved_device()),
        dtype=str(config.resolved_dtype()).removeprefix("torch."),
        load_s=round(load_s, 3),
        **summary,
        peak_rss_mb=round(common.peak_rss_mb_self(), 1),
        first_tokens=first_tokens,
        **extra,
    )
    common.emit(res)


if __name__ == "__main__":
    main()
