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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common
from bench_dtype import bench_dtype


def greedy_generation_config(model: Any) -> Any:
    """The model's generation config for greedy decoding that never stops early (ignore_eos: no EOS, no
    suppression of it) and pads with id 3."""
    gen_cfg = model.generation_config
    gen_cfg.eos_token_id = None
    gen_cfg.pad_token_id = 3
    gen_cfg.do_sample = False
    gen_cfg.temperature = None
    gen_cfg.top_p = None
    gen_cfg.top_k = None
    return gen_cfg


def left_padded_batch(prompts: list[list[int]], device: Any) -> tuple[Any, Any]:
    """(input_ids, attention_mask) [num_prompts, longest] on `device`, left-padded with id 3."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), 3, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    return input_ids.to(device), attn.to(device)


def timed_generate(
    model: Any, input_ids: Any, attn: Any, gen_cfg: Any, max_new: int, adapter_names: list[str] | None = None
) -> dict[str, Any]:
    """One greedy `generate` of exactly `max_new` tokens per row, every step stamped (a StoppingCriteria; on
    CUDA after a synchronize, so a stamp follows its step's kernels): total_s, prefill_s (step 1: the prompt
    and the first token), decode_step_s (steps 2..), out (prompt + new ids)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    clock = common.StepClock()
    is_cuda = input_ids.device.type == "cuda"

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            if is_cuda:
                torch.cuda.synchronize()
            clock.tick()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    kw = {} if adapter_names is None else {"adapter_names": adapter_names}
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
    total = time.perf_counter() - clock.t0
    prefill, decode = clock.split(1)
    return {
        "total_s": total,
        "prefill_s": prefill[0] if prefill else None,
        "decode_step_s": decode,
        "out": out,
    }


def main() -> None:
    args = common.peer_argparser(__doc__.splitlines()[0], ["base", "lora"]).parse_args()
    t_load0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    common.set_threads(args.threads)

    base_dir = args.model_dir / "base"
    # the engine's device=auto rule: CUDA when there is one, so both peers run on the same device
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = bench_dtype()
    model: Any = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=getattr(torch, dtype))
    names = common.adapter_names(args.model_dir, args.num_requests)
    distinct = sorted(set(names))
    if args.mode == "lora":
        from peft import PeftModel

        adir = args.model_dir / "adapters"
        model = PeftModel.from_pretrained(model, str(adir / distinct[0]), adapter_name=distinct[0])
        for name in distinct[1:]:
            model.load_adapter(str(adir / name), adapter_name=name)
    model = model.to(device).eval()
    gen_cfg = greedy_generation_config(model)
    load_s = time.perf_counter() - t_load0

    prompts = common.make_prompts(common.vocab_size(args.model_dir), args.num_requests, args.prompt_len)
    # All prompts have the same length, so left padding is a no-op here; keep the general path anyway.
    input_ids, attn = left_padded_batch(prompts, device)
    width = input_ids.shape[1]
    adapter_names = names if args.mode == "lora" else None

    timed_generate(
        model, input_ids, attn, gen_cfg, args.warmup_tokens, adapter_names
    )  # same prompts, shorter
    runs = []
    new_tokens = 0
    for _ in range(args.repeats):
        run = timed_generate(model, input_ids, attn, gen_cfg, args.max_tokens, adapter_names)
        out = run.pop("out")
        new_tokens = int(out.shape[1] - width) * out.shape[0]
        runs.append(run)
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
