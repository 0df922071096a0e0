"""transformers (+ peft) peer for benchmarks/engine_throughput.py. Run with the project venv.

Modes:
  base  plain AutoModelForCausalLM, one left-padded batch of all requests, greedy, in
        $LORAHOST_BENCH_DTYPE (engine_throughput.py sets it), else the engine's auto dtype for this CPU.
  lora  PeftModel with every adapter loaded (load_adapter), all requests in ONE batch with
        `generate(..., adapter_names=[...])` (peft mixed-batch inference).

Step times come from a StoppingCriteria that stamps every generation step: step 1 = prefill (+ first
sample), steps 2..N = decode steps. EOS is ignored by clearing eos_token_id (no logit suppression).
Prints one JSON line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common
from bench_dtype import bench_dtype


def main() -> None:
    args = common.peer_argparser(__doc__.splitlines()[0], ["base", "lora"]).parse_args()
    t_load0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    common.set_threads(args.threads)

    base_dir = args.model_dir / "base"
    # the engine's device=auto rule: CUDA when there is one, so both peers run on the same device
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = bench_dtype()
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=getattr(torch, dtype))
    names = common.adapter_names(args.model_dir, args.num_requests)
    distinct = sorted(set(names))
    if args.mode == "lora":
        from peft import PeftModel

        adir = args.model_dir / "adapters"
        model = PeftModel.from_pretrained(model, str(adir / distinct[0]), adapter_name=distinct[0])
        for name in distinct[1:]:
            model.load_adapter(str(adir / name), adapter_name=name)
    model = model.to(device).eval()
    gen_cfg = model.generation_config
    gen_cfg.eos_token_id = None  # ignore_eos: never stop early, never suppress EOS
    gen_cfg.pad_token_id = 3
    gen_cfg.do_sample = False
    gen_cfg.temperature = None
    gen_cfg.top_p = None
    gen_cfg.top_k = None
    load_s = time.perf_counter() - t_load0

    prompts = common.make_prompts(common.vocab_size(args.model_dir), args.num_requests, args.prompt_len)
    # All prompts have the same length, so left padding is a no-op here; keep the general path anyway.
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), 3, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    input_ids, attn = input_ids.to(device), attn.to(device)

    clock = common.StepClock()

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            if device.type == "cuda":
                torch.cuda.synchronize()  # a step's time stamp after its kernels, not after their launch
            clock.tick()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def run(max_new: int) -> tuple[float, torch.Tensor]:
        kw = {}
        if args.mode == "lora":
            kw["adapter_names"] = names
        clock.start()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attn,
                generation_config=gen_cfg,
                max_new_tokens=max_new,
                min_new_tokens=0,
                stopping_criteria=StoppingCriteriaList([Stamp()]),
                **kw,
            )
        return time.perf_counter() - clock.t0, out

    run(args.warmup_tokens)  # warm-up: same prompts, same adapters, shorter output
    runs = []
    new_tokens = 0
    for _ in range(args.repeats):
        total, out = run(args.max_tokens)
        new_tokens = int(out.shape[1] - width) * out.shape[0]
        prefill, decode = clock.split(1)
        runs.append({"total_s": total, "prefill_s": prefill[0] if prefill else None, "decode_step_s": decode})
    assert new_tokens == args.num_requests * args.max_tokens, (
        new_tokens,
        args.num_requests * args.max_tokens,
    )

    res = common.base_result(
        "hf",
        args.mode,
        args,
        engine=f"transformers {__import__('transformers').__version__}"
        + (f" + peft {__import__('peft').__version__}" if args.mode == "lora" else ""),
        adapters=len(distinct) if args.mode == "lora" else 0,
        torch_threads=torch.get_num_threads(),
        device=str(device),
        dtype=dtype,
        load_s=round(load_s, 3),
        **common.summarize_runs(runs, args.num_requests * args.max_tokens),
        peak_rss_mb=round(common.peak_rss_mb_self(), 1),
        first_tokens=out[:2, width : width + 8].tolist(),
    )
    common.emit(res)


if __name__ == "__main__":
    main()
