"""Structured outputs on a real model (issue 37 goals): JSON-schema outputs sampled at temperature 1 with
adapters must parse and validate every time, and the step time of a batch of 16 where half the rows are
constrained, against the same batch unconstrained. One JSON line per result.

    python benchmarks/engine_workload.py smollm2 ~/.cache/lorahost/bench-smollm2-16 --num-adapters 16
    python benchmarks/structured_outputs.py ~/.cache/lorahost/bench-smollm2-16 --num-requests 200

TPOT: both batches run 16 rows for `--decode-tokens` steps (free rows with ignore_eos; constrained rows on a
schema whose instances are longer than that, so none ends early); the median decode-step time of each, in
alternating repeats; the ratio is constrained / free.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.run_info import cpu_model

EXTRACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email", "maxLength": 40},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "status": {"anyOf": [{"type": "null"}, {"enum": ["active", "inactive"]}]},
    },
    "required": ["name", "age", "email", "tags", "address", "status"],
    "additionalProperties": False,
}
LONG_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 999}, "minItems": 64}
PROMPT = "Extract the person as JSON: Ada Lovelace, 36, ada@example.org, lives in London (zip 10115), active."


def machine() -> dict:
    """The CPU and its load (other agents share it)."""
    return {"cpu": cpu_model(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def make_engine(workload: Path, num_threads: int):  # type: ignore[no-untyped-def]
    """The native engine on workload/base with every adapter of workload/adapters loaded."""
    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model_path=workload / "base", num_threads=num_threads, max_num_seqs=16))
    names = []
    for path in sorted((workload / "adapters").iterdir()):
        engine.load_adapter(path.name, path)
        names.append(path.name)
    return engine, names


def validity(engine, names: list[str], num_requests: int, max_tokens: int) -> dict:  # type: ignore[no-untyped-def]
    """num_requests sampled JSON-schema outputs (temperature 1, adapters in turn): how many parse and validate."""
    import jsonschema

    from scheduler.core.sampling import SamplingParams
    from scheduler.core.structured_output import StructuredOutput

    structured = StructuredOutput.json_schema(EXTRACTION_SCHEMA)
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, structured_output=structured)
        for i in range(num_requests)
    ]
    chat = [{"role": "user", "content": PROMPT}]
    prompt = engine.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    started = time.perf_counter()
    outputs = engine.generate(
        [prompt] * num_requests, params, [names[i % len(names)] for i in range(num_requests)]
    )
    seconds = time.perf_counter() - started
    num_valid, failures = 0, []
    for out in outputs:
        try:
            jsonschema.validate(json.loads(out.text), EXTRACTION_SCHEMA)
            num_valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            failures.append(
                {"text": out.text[:200], "finish_reason": out.finish_reason, "error": str(exc)[:120]}
            )
    return {
        "result": "json_schema_validity",
        "num_requests": num_requests,
        "num_valid": num_valid,
        "num_finished_stop": sum(o.finish_reason == "stop" for o in outputs),
        "first_failures": failures[:3],
        "example": outputs[0].text,
        "seconds": round(seconds, 1),
        **machine(),
    }


def decode_step_times(engine, names: list[str], num_constrained: int, decode_tokens: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Seconds of each step in which all 16 rows decode (after every prefill)."""
    from scheduler.core.sampling import SamplingParams
    from scheduler.core.structured_output import StructuredOutput

    long = StructuredOutput.json_schema(LONG_SCHEMA)
    for i in range(16):
        is_constrained = i < num_constrained
        params = SamplingParams(
            max_tokens=decode_tokens, temperature=1.0, seed=i, ignore_eos=not is_constrained,
            structured_output=long if is_constrained else None,
        )  # fmt: skip
        engine.add_request(
            engine.make_request(
                f"tpot-{num_constrained}-{time.time_ns()}-{i}", PROMPT, params, names[i % len(names)]
            )
        )
    times = []
    while engine.core.has_unfinished_requests():
        running = engine.scheduler.running
        is_decode = len(running) == 16 and all(s.num_output_tokens > 0 for s in running)
        started = time.perf_counter()
        engine.step()
        if is_decode:
            times.append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workload", type=Path, help="DIR with base/ and adapters/ (benchmarks/engine_workload.py)"
    )
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--skip-validity", action="store_true")
    args = parser.parse_args(argv)
    engine, names = make_engine(args.workload.expanduser(), args.num_threads)
    if not args.skip_validity:
        print(json.dumps(validity(engine, names, args.num_requests, args.max_tokens)), flush=True)
    medians: dict[int, list[float]] = {0: [], 8: []}
    for _ in range(args.repeats):
        for num_constrained in (0, 8):
            times = decode_step_times(engine, names, num_constrained, args.decode_tokens)
            medians[num_constrained].append(statistics.median(times))
    free, constrained = statistics.median(medians[0]), statistics.median(medians[8])
    print(json.dumps({
        "result": "tpot_half_constrained_batch_16",
        "free_step_ms": round(free * 1000, 2),
        "half_constrained_step_ms": round(constrained * 1000, 2),
        "ratio": round(constrained / free, 3),
        "repeat_medians_ms": {k: [round(x * 1000, 2) for x in v] for k, v in medians.items()},
        **machine(),
    }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
