"""One adapter-memory benchmark run inside its own process: an open-loop replay against the native engine.

`adapter_memory.py --run-one SPEC.json` lands here (`run_one`). The spec names the base model, the adapters
(name -> host path), the workload file (requests with token ids and arrival offsets), the full
`EngineConfig` keyword arguments and the drain limit. The replay registers every adapter (host copies only),
warms the engine up with one base-model request, then adds each request when its arrival time (relative to
the replay start) has passed, steps the engine while it has work and otherwise sleeps until the next
arrival. TTFT and E2E count from the scheduled arrival, so time a request waited for a running step counts.

A request is *cold* when its adapter is not on the device (`adapter_residency != "device"`) when it
arrives; the rest are warm. The pure metric helpers (`pct`, `summarize_records`) are imported by the tests.

Optional request keys (benchmarks/scheduling.py): `predicted_output_tokens` (what the batch policy sees),
`max_tokens` (the API cap; default `output_tokens`): a request whose cap is above its true `output_tokens` is
stopped by the replay once it has that many tokens (finish reason "length"), so the engine never sees the
true length. `first_scheduled` is the engine's first step that ran any of its tokens. With
`spec["return_records"]` the result holds the per-request records (`records`, without token times).
`spec["policy_history"]` (requests with negative `arrival_s`, `prompt_tokens`, `max_tokens`, `adapter`,
`predicted_output_tokens`) is shown to the batch policy before the replay starts (`prime_policy`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from serving_metrics import pct  # one percentile definition for every benchmark

from scheduler.core.engine_request import EngineRequest

STAT_KEYS = (
    "num_adapter_hits",
    "num_adapter_misses",
    "num_adapter_evictions",
    "num_adapter_loads",
    "num_adapter_prefetches",
    "num_cpu_assisted_prefills",
    "num_preemptions",
    "num_steps",
    "num_adapter_pages",
    "num_pool_pages",
    "num_kv_blocks",
    "step_seconds_mean",
    "step_seconds_max",
)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 2)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else round(num / den, 3)


def summarize_records(records: list[dict], stats: dict[str, Any]) -> dict[str, Any]:
    """Latency, throughput and residency metrics of one replay.

    records: one dict per request with `arrival`, `first_token`, `finish` (seconds since the replay start;
    None when it never happened), `token_times` (one per output token), `num_output_tokens`, `cold` (adapter
    not on the device at arrival), `first_of_adapter`, `finish_reason`.
    """
    done = [r for r in records if r["finish"] is not None and r["finish_reason"] in ("length", "stop")]
    ttft = [r["first_token"] - r["arrival"] for r in records if r["first_token"] is not None]
    e2e = [r["finish"] - r["arrival"] for r in done]
    gaps = [b - a for r in records for a, b in zip(r["token_times"], r["token_times"][1:])]
    cold = [r["first_token"] - r["arrival"] for r in records if r["cold"] and r["first_token"] is not None]
    warm = [
        r["first_token"] - r["arrival"] for r in records if not r["cold"] and r["first_token"] is not None
    ]
    started = [r for r in records if r["first_token"] is not None]
    first = [r["first_token"] - r["arrival"] for r in started if r["first_of_adapter"]]
    later = [r["first_token"] - r["arrival"] for r in started if not r["first_of_adapter"]]
    makespan = max((r["finish"] for r in done), default=0.0)
    out_tokens = sum(r["num_output_tokens"] for r in done)
    hits, misses = stats.get("num_adapter_hits"), stats.get("num_adapter_misses")
    engine_hit_rate = None
    if hits is not None and misses is not None and hits + misses > 0:
        engine_hit_rate = round(hits / (hits + misses), 4)
    cold_p50, warm_p50 = pct(cold, 50), pct(warm, 50)
    return {
        "num_requests": len(records),
        "completed": len(done),
        "num_errors": sum(r["finish_reason"] == "error" for r in records),
        "num_incomplete": sum(r["finish"] is None or r["finish_reason"] == "abort" for r in records),
        "ttft_ms_p50": _ms(pct(ttft, 50)),
        "ttft_ms_p99": _ms(pct(ttft, 99)),
        "ttft_ms_mean": _ms(sum(ttft) / len(ttft)) if ttft else None,
        "tbt_ms_p99": _ms(pct(gaps, 99)),
        "e2e_ms_p50": _ms(pct(e2e, 50)),
        "e2e_ms_p99": _ms(pct(e2e, 99)),
        "throughput_rps": round(len(done) / makespan, 4) if makespan > 0 else None,
        "out_tok_s": round(out_tokens / makespan, 2) if makespan > 0 else None,
        "makespan_s": round(makespan, 3),
        "hit_rate": engine_hit_rate,  # engine counters (None when this build lacks them)
        "request_hit_rate": round(len(warm) / (len(warm) + len(cold)), 4) if warm or cold else None,
        "num_cold": len(cold),
        "num_warm": len(warm),
        "cold_ttft_ms_p50": _ms(cold_p50),
        "cold_ttft_ms_mean": _ms(sum(cold) / len(cold)) if cold else None,
        "warm_ttft_ms_p50": _ms(warm_p50),
        "warm_ttft_ms_mean": _ms(sum(warm) / len(warm)) if warm else None,
        "cold_vs_warm_ttft_p50": _ratio(cold_p50, warm_p50),
        "cold_vs_warm_ttft_mean": _ratio(
            sum(cold) / len(cold) if cold else None, sum(warm) / len(warm) if warm else None
        ),
        "first_of_adapter_vs_later_ttft_p50": _ratio(pct(first, 50), pct(later, 50)),
        "stats": {k: stats[k] for k in STAT_KEYS if k in stats},
    }


def _load_spec(path: Path) -> dict:
    spec = json.loads(Path(path).read_text())
    spec["requests"] = json.loads(Path(spec["workload_path"]).read_text())
    return spec


def _make_engine(spec: dict):
    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model_path=spec["model_base"], **spec["engine"]))
    for name, path in spec["adapters"].items():
        engine.register_adapter(name, path)
    return engine


def _warm_up(engine, sampling_cls) -> None:
    engine.add_request(
        EngineRequest(
            "warmup", list(range(10, 42)), sampling_cls(max_tokens=2, ignore_eos=True, temperature=0)
        )
    )
    while engine.has_unfinished_requests():
        engine.step()


def replay(spec: dict) -> dict[str, Any]:
    """Open-loop replay of spec["requests"]; returns the per-run metrics."""
    from scheduler.core.sampling import SamplingParams

    engine = _make_engine(spec)
    _warm_up(engine, SamplingParams)
    reqs = sorted(spec["requests"], key=lambda r: r["arrival_s"])
    records: dict[str, dict] = {}
    seen: set[str] = set()
    drain_s = float(spec.get("drain_s", 120.0))
    t0 = time.time()
    prime_policy(engine, spec.get("policy_history", []), t0)
    i = 0
    while i < len(reqs) or engine.has_unfinished_requests():
        now = time.time() - t0
        while i < len(reqs) and reqs[i]["arrival_s"] <= now:
            r = reqs[i]
            rid = f"r{r['index']}"
            adapter = r["adapter"]
            records[rid] = {
                "index": r["index"],
                "adapter": adapter,
                "arrival": r["arrival_s"],
                "first_token": None,
                "finish": None,
                "finish_reason": None,
                "first_scheduled": None,
                "output_tokens": r["output_tokens"],
                "token_times": [],
                "num_output_tokens": 0,
                "cold": engine.adapter_residency(adapter) != "device",
                "first_of_adapter": adapter not in seen,
            }
            seen.add(adapter)
            max_tokens = r.get("max_tokens", r["output_tokens"])
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
            engine.add_request(
                EngineRequest(
                    rid,
                    r["prompt_token_ids"],
                    params,
                    adapter_id=adapter,
                    arrival_time=t0 + r["arrival_s"],
                    predicted_output_tokens=r.get("predicted_output_tokens"),
                )
            )
            i += 1
        if engine.has_unfinished_requests():
            if i >= len(reqs) and now > reqs[-1]["arrival_s"] + drain_s:
                for rid, rec in records.items():
                    if rec["finish"] is None:
                        engine.abort(rid)
                break
            for out in engine.step():
                rec = records.get(out.request_id)
                if rec is not None and rec["finish"] is None:
                    _record_output(engine, rec, out, time.time() - t0, t0)
        elif i < len(reqs):
            time.sleep(max(0.0, min(reqs[i]["arrival_s"] - (time.time() - t0), 0.5)))
    stats = engine.engine_stats().model_dump(mode="json", include=set(STAT_KEYS))  # the JSON it writes
    result = summarize_records(list(records.values()), stats)
    result["replay_wall_s"] = round(time.time() - t0, 2)
    from scheduler.admission.fair_share import base_policy

    result["policy_state"] = _policy_state(base_policy(engine.scheduler.policy))
    if spec.get("return_records"):
        result["records"] = [
            {k: _rounded(v) for k, v in rec.items() if k != "token_times"} for rec in records.values()
        ]
    return result


def prime_policy(engine, history: list[dict], t0: float) -> None:
    """Show the engine's batch policy the recent past without running it: one `plan` call with the history
    as waiting requests and no free sequence (nothing is admitted), then `on_finished` for each.

    A server's policy has seen its traffic before any measured request; a policy in a fresh process would
    start cold (the multi-queue policy keeps one queue until its window holds `min_samples` requests).
    Stateless policies (fifo, sjf) are unaffected.
    """
    if not history:
        return
    from scheduler.admission.admission import BatchBudget, WaitingRequest

    scheduler = engine.scheduler
    waiting = []
    for r in history:
        state = engine.residency.get(r["adapter"])
        waiting.append(
            WaitingRequest(
                request_id=r["request_id"],
                arrival_time=t0 + r["arrival_s"],
                num_prompt_tokens=r["prompt_tokens"],
                max_tokens=r["max_tokens"],
                adapter_id=r["adapter"],
                adapter_rank=state.rank if state is not None else 0,
                predicted_output_tokens=r["predicted_output_tokens"],
                adapter_num_bytes=state.num_bytes if state is not None else 0,
                adapter_residency="host",
            )
        )
    budget = BatchBudget(
        num_free_seqs=0,
        num_free_tokens=0,
        num_free_blocks=scheduler.num_reclaimable_blocks(),
        block_size=scheduler.pool.block_size,
        now=t0,
        num_total_blocks=scheduler.pool.num_blocks,
        num_bytes_per_block=scheduler.residency.page_bytes,
    )
    scheduler.policy.plan(waiting, budget)
    for request in waiting:
        scheduler.policy.on_finished(request.request_id, now=t0)


def _policy_state(policy) -> dict[str, Any]:
    """What a stateful policy reports about itself (e.g. multiqueue's queues), for the result line."""
    keys = ("num_queues", "num_refreshes", "quota_tokens")
    return {k: getattr(policy, k) for k in keys if hasattr(policy, k)}


def _record_output(engine, rec: dict, out, t: float, t0: float) -> None:
    """Fold one engine output into its request's record; stop the request at its true length."""
    if rec["first_scheduled"] is None and getattr(out, "first_scheduled_time", None) is not None:
        rec["first_scheduled"] = out.first_scheduled_time - t0
    if out.new_token_ids:
        rec["token_times"].extend([t] * len(out.new_token_ids))
        if rec["first_token"] is None:
            rec["first_token"] = t
    rec["num_output_tokens"] = out.num_output_tokens
    if out.is_finished:
        rec["finish"], rec["finish_reason"] = t, out.finish_reason
    elif out.num_output_tokens >= rec["output_tokens"]:  # its cap is above its true length: stop it here
        engine.abort(out.request_id)
        rec["finish"], rec["finish_reason"] = t, "length"


def _rounded(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def calibrate(spec: dict) -> dict[str, Any]:
    """Unloaded TTFT: the first requests one at a time (one output token each), after the warm-up."""
    from scheduler.core.sampling import SamplingParams

    engine = _make_engine(spec)
    _warm_up(engine, SamplingParams)
    ttfts = []
    for r in spec["requests"][: int(spec.get("num_calibration", 8))]:
        t = time.time()
        engine.add_request(
            EngineRequest(
                f"c{r['index']}",
                r["prompt_token_ids"],
                SamplingParams(max_tokens=1, ignore_eos=True, temperature=0),
                adapter_id=r["adapter"],
                arrival_time=t,
            )
        )
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.new_token_ids and first is None:
                    first = time.time()
        if first is not None:
            ttfts.append(first - t)
    return {
        "unloaded_ttft_ms_mean": _ms(sum(ttfts) / len(ttfts)) if ttfts else None,
        "unloaded_ttft_ms_p50": _ms(pct(ttfts, 50)),
        "num_calibration": len(ttfts),
    }


def run_one(spec_path: str) -> int:
    """Entry of the child process: print one JSON line (the metrics, or an error)."""
    spec = _load_spec(Path(spec_path))
    try:
        result = calibrate(spec) if spec.get("mode") == "calibrate" else replay(spec)
    except (
        TypeError,
        ValidationError,
    ) as exc:  # an EngineConfig keyword this build lacks (the parent catches it)
        result = {"skipped": f"EngineConfig rejected the overrides: {exc}"}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_one(sys.argv[1]))
