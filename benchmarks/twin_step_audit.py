"""Where does the real engine's time go that the twin does not charge? One case of benchmarks/twin_fidelity.py,
replayed on the real engine with every step recorded (its shape, its wall time, what the adapter loads were
doing meanwhile) and priced by the profile's cost model, and in the twin with its own steps recorded; then
the real steps' time against their price by kind of step, and each request's TTFT split into waiting and
its first token's steps, real against twin.

    .venv/bin/python benchmarks/twin_step_audit.py --model-dir ~/.cache/lorahost/bench-smollm2-100 \\
        --profile twin/profiles/cpu-smollm2-135m-lorahost-xeon.json --threads 2 --num-requests 30 \\
        --max-prompt 256 --max-output 64 --max-num-seqs 16 --case conv/slot/unified/fifo/a16/x0.9

Step kinds: `host` (a host-assisted prefill: some entry's LoRA delta runs on a host copy), `prepare` (an
adapter's host copy was being made on the preparer thread while the step ran), `copy` (a copy to the device
was under way), `clean` (no load in flight). `--output` writes every step and request as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import twin_fidelity as tf
from benchmarks.run_info import cpu_model
from twin.request_record import RequestRecord

KINDS = ("host", "prepare", "copy", "clean")


def parse_case(text: str) -> tf.Case:
    """`trace/bound/memory_mode/policy/aN/xLOAD` (a twin_fidelity case name) -> Case."""
    trace, bound, memory_mode, policy, adapters, load = text.split("/")
    return tf.Case(trace, float(load.lstrip("x")), policy, memory_mode, int(adapters.lstrip("a")), bound)


def load_state(engine: Any) -> str:
    """What the adapter loads are doing now: prepare (a host copy being made), copy, or clean."""
    jobs = list(engine.runner.transfers.copier._jobs.values())
    if any(not j.prepared.is_set() for j in jobs):
        return "prepare"
    if any(not j.done.is_set() for j in jobs):
        return "copy"
    return "clean"


def record_real_steps(engine: Any, clock: Any, cost: Any, ranks: dict[str, int]) -> list[dict[str, Any]]:
    """Wrap the real executor's run_step: every step's start, wall seconds, price and kind."""
    from twin.step_shape import StepShape

    executor, steps = engine.core.executor, []
    run_step = executor.run_step

    def recorded(entries: list[Any], host_assisted: Any) -> Any:
        shape = StepShape.of(entries, ranks, host_assisted)
        state, started = load_state(engine), time.perf_counter()
        tokens = run_step(entries, host_assisted)
        seconds = time.perf_counter() - started
        kind = "host" if host_assisted else (state if state != "clean" else load_state(engine))
        steps.append(_step_row(clock() - seconds, seconds, shape, kind, cost))
        return tokens

    executor.run_step = recorded
    return steps


def record_twin_steps(worker: Any, cost: Any) -> list[dict[str, Any]]:
    """Wrap the simulated executor's run_step (host-assisted and prefill steps; decode windows are counted
    apart)."""
    from twin.step_shape import StepShape

    executor, steps = worker.executor, []
    run_step = executor.run_step

    def recorded(entries: list[Any], host_assisted: Any) -> Any:
        started = executor.clock()
        tokens = run_step(entries, host_assisted)
        shape = StepShape.of(entries, executor.ranks, host_assisted)
        kind = "host" if host_assisted else ("copy" if executor.has_copies_in_flight() else "clean")
        steps.append(_step_row(started, executor.clock() - started, shape, kind, cost))
        return tokens

    executor.run_step = recorded
    return steps


def record_prepares(copier: Any) -> list[tuple[str, float]]:
    """Wrap the copier's take_prepared: (adapter id, seconds its host copy took) per preparation."""
    prepares: list[tuple[str, float]] = []
    take = copier.take_prepared

    def recorded() -> Any:
        jobs = take()
        prepares.extend((j.adapter_id, j.prepare_seconds) for j in jobs if not j.is_from_host_tier)
        return jobs

    copier.take_prepared = recorded
    return prepares


def _step_row(started: float, seconds: float, shape: Any, kind: str, cost: Any) -> dict[str, Any]:
    return {
        "start_s": started,
        "seconds": seconds,
        "price_s": cost.step_seconds(shape),
        "kind": kind,
        "prefill_tokens": shape.num_prefill_tokens,
        "decode_seqs": shape.num_decode_seqs,
        "host_token_ranks": list(shape.host_token_ranks),
        "adapter_ranks": list(shape.adapter_ranks),
        "decode_context_tokens": shape.decode_context_tokens,
        "lora_price_s": cost.lora_us(shape) * 1e-6,
    }


def by_kind(steps: list[dict[str, Any]]) -> list[str]:
    """Per step kind: count, wall seconds, priced seconds, median wall / price."""
    lines = []
    for kind in KINDS:
        rows = [s for s in steps if s["kind"] == kind]
        if not rows:
            continue
        wall, price = sum(s["seconds"] for s in rows), sum(s["price_s"] for s in rows)
        ratio = statistics.median(s["seconds"] / max(s["price_s"], 1e-9) for s in rows)
        lines.append(
            f"  {kind:<8} {len(rows):4d} steps  wall {wall:7.2f} s  priced {price:7.2f} s  "
            f"excess {wall - price:+6.2f} s  median wall/price {ratio:.2f}"
        )
    return lines


def ttft_split(records: list[RequestRecord]) -> dict[str, float]:
    """Medians over requests: TTFT, waiting (arrival -> first step), first step -> first token."""
    done = [r for r in records if r.token_times and r.first_scheduled_s is not None]
    return {
        "ttft_p50_ms": 1e3 * statistics.median(r.ttft_s for r in done),  # type: ignore[misc]
        "wait_p50_ms": 1e3 * statistics.median(r.queueing_s for r in done),  # type: ignore[misc]
        "run_p50_ms": 1e3 * statistics.median(r.token_times[0] - r.first_scheduled_s for r in done),  # type: ignore[operator]
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--case", default="conv/slot/unified/fifo/a16/x0.9")
    p.add_argument("--steps-output", type=Path, default=None)
    own, rest = p.parse_known_args(argv)
    args = tf.parse_args(rest)
    import torch

    from twin.cost_model import CostModel
    from twin.profile import load_profile
    from twin.worker_sim import SimulatedWorker

    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile)
    cost = CostModel(profile)
    case = parse_case(own.case)
    all_names = sorted(d.name for d in (args.model_dir / "adapters").iterdir() if d.is_dir())
    engine, clock, adapters, capacity, trace = tf.set_up_case(args, case, profile, all_names)
    worker = SimulatedWorker(
        engine.config, engine.runner.geometry, cost, adapters, max_lora_rank=engine.config.max_lora_rank
    )
    twin_steps = record_twin_steps(worker, cost)
    twin_records = worker.run(trace)
    vocab = engine.runner.args.vocab_size
    tf.warm_up(engine, trace, vocab)
    real_steps = record_real_steps(engine, clock, cost, {a.adapter_id: a.rank for a in adapters})
    prepares = record_prepares(engine.runner.transfers.copier)
    real_records = tf.run_real(engine, clock, trace, vocab)
    print(f"{case.name} rate {case.load * capacity:.2f}/s on {cpu_model()}")
    print("real steps (priced by the profile):", *by_kind(real_steps), sep="\n")
    print("twin steps (run_step only):", *by_kind(twin_steps), sep="\n")
    sizes = {a.adapter_id: a.num_bytes for a in adapters}
    priced = [cost.prepare_seconds(sizes[a]) for a, _ in prepares]
    print(
        f"real preparations: {len(prepares)}, {sum(s for _, s in prepares):.2f} s "
        f"(priced {sum(priced):.2f} s; median wall/price "
        f"{statistics.median(s / p for (_, s), p in zip(prepares, priced)) if prepares else 0:.2f})"
    )
    print("TTFT split real:", ttft_split(real_records), "\nTTFT split twin:", ttft_split(twin_records))
    twin_by_id = {r.request_id: r for r in twin_records}
    rows = []
    for r in real_records:
        t = twin_by_id[r.request_id]
        rows.append(
            {
                "id": r.request_id,
                "adapter": r.adapter_id,
                "prompt": r.num_prompt_tokens,
                "arrival_s": r.arrival_s,
                "real": [r.first_scheduled_s, r.token_times[0] if r.token_times else None],
                "twin": [t.first_scheduled_s, t.token_times[0] if t.token_times else None],
            }
        )
    if own.steps_output is not None:
        own.steps_output.write_text(
            json.dumps(
                {"real_steps": real_steps, "twin_steps": twin_steps, "requests": rows, "prepares": prepares},
                indent=0,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
