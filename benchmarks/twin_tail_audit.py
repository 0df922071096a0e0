"""What holds the tail of section 1 (twin_papers.py, Chameleon): for one (load, seed), every policy's slowest
requests' TTFT split by what each waited for, step by step, in the digital twin (simulated time).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/twin_tail_audit.py --load 0.95 --seed 0 --num-requests 2000

Each full plan of the batch scheduler (`BatchScheduler._admit_waiting`) is recorded; a waiting request's time
from one plan to the next is charged to why it was still waiting after the plan:
- `quota`: the policy did not plan it this step (the multi-queue's class quota was spent);
- `closed`: planned, but not tried: an earlier request that did not fit closed the plan (FIFO's head, or the
  multi-queue's aged barrier) or blocked its group;
- `budget`: planned, but not tried: the step's token budget or sequence slots ran out, or there was no plan
  (no free slot or token budget at all);
- `kv`: tried, and its KV pages did not fit (it waits for running requests to finish);
- `adapter`: tried, and its adapter found no device memory, or it waited for its adapter's copy;
- `arrival`: from its arrival to the first plan that saw it (a step was running);
- `prefill`: from its admission to its first token.
The shares are of the summed TTFT of the requests at or above the P99 (`--top` sets the percentile).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import twin_papers as tp
from benchmarks.run_info import cpu_model
from scheduler.core import admission_gate, batch_scheduler
from twin.profile import load_profile

REASONS = ("arrival", "quota", "closed", "budget", "kv", "adapter", "prefill")


class _Recorder:
    """Per request: (plan time, why it still waits) after each full plan, and its admission time."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[float, str]]] = defaultdict(list)
        self.admitted_at: dict[str, float] = {}
        self.shorts: dict[str, str] = {}
        self.not_tried: set[str] = set()
        self.is_closed = False


class _RecordingGate(admission_gate.AdmissionGate):
    recorder: _Recorder

    def may_try(self, request_id: str) -> bool:
        allowed = super().may_try(request_id)
        if not allowed:
            self.recorder.not_tried.add(request_id)
        return allowed

    def on_short(self, request_id: str, is_adapter_short: bool) -> None:
        self.recorder.shorts[request_id] = "adapter" if is_adapter_short else "kv"
        super().on_short(request_id, is_adapter_short)
        self.recorder.is_closed = self.recorder.is_closed or self.is_closed


def install(recorder: _Recorder) -> Any:
    """Wrap the batch scheduler's admission so that every plan is recorded; returns an undo function."""
    original = batch_scheduler.BatchScheduler._admit_waiting
    original_gate = batch_scheduler.AdmissionGate
    _RecordingGate.recorder = recorder

    def recorded(self: Any, plan: Any, budget: int) -> bool:
        now = self.clock()
        recorder.shorts.clear()
        recorder.not_tried.clear()
        recorder.is_closed = False
        self._admission_order = []
        is_short = original(self, plan, budget)
        planned = set(self._admission_order)
        for request_id in [*planned, *self.waiting]:
            if request_id not in self.waiting:
                recorder.admitted_at.setdefault(request_id, now)
        for request_id in self.waiting:
            if request_id in recorder.shorts:
                why = recorder.shorts[request_id]
            elif planned and request_id not in planned:
                why = "quota"
            elif request_id in plan.copy_waits:
                why = "adapter"
            elif request_id in recorder.not_tried or (recorder.is_closed and request_id in planned):
                why = "closed"
            else:
                why = "budget"
            recorder.events[request_id].append((now, why))
        return is_short

    batch_scheduler.BatchScheduler._admit_waiting = recorded  # type: ignore[method-assign]
    batch_scheduler.AdmissionGate = _RecordingGate  # type: ignore[misc]

    def undo() -> None:
        batch_scheduler.BatchScheduler._admit_waiting = original  # type: ignore[method-assign]
        batch_scheduler.AdmissionGate = original_gate  # type: ignore[misc]

    return undo


def split_ttft(record: Any, recorder: _Recorder) -> dict[str, float]:
    """Seconds of one request's TTFT by reason (module doc)."""
    parts = dict.fromkeys(REASONS, 0.0)
    first_token = record.token_times[0]
    admitted = recorder.admitted_at.get(record.request_id, record.first_scheduled_s or first_token)
    events = [(t, why) for t, why in recorder.events.get(record.request_id, []) if t < admitted]
    if not events:
        parts["arrival"] += max(0.0, admitted - record.arrival_s)
    else:
        parts["arrival"] += max(0.0, events[0][0] - record.arrival_s)
        ends = [t for t, _ in events[1:]] + [admitted]
        for (t, why), end in zip(events, ends, strict=True):
            parts[why] += max(0.0, end - t)
    parts["prefill"] += max(0.0, first_token - max(admitted, record.arrival_s))
    return parts


def audit(load: float, seed: int, num_requests: int, configs: list[str], top: float) -> dict[str, Any]:
    """Run each config on the section's trace for (load, seed); the tail's TTFT split by reason."""
    profile = load_profile(tp.DEFAULT_PROFILE)
    small = tp.with_device_bytes(profile, tp.CHAMELEON_DEVICE_BYTES)
    adapters = tp.make_adapters(small, tp.rank_mix(100, tp.CHAMELEON_RANKS, 0))
    ids = [a.adapter_id for a in adapters]
    base = tp.poisson_trace(tp.conv_lengths(num_requests, seed), ids, 1.0, seed)
    capacity = tp.saturated_rps(small, tp.chameleon_engine("fifo"), adapters, base)
    trace = tp.at_rate(base, load * capacity, seed)
    out: dict[str, Any] = {
        "load": load,
        "seed": seed,
        "num_requests": num_requests,
        "rate_rps": load * capacity,
    }
    for config in configs:
        policy, sizing, is_cached = tp.CHAMELEON_CONFIGS[config]
        recorder = _Recorder()
        undo = install(recorder)
        try:
            run = tp.run_worker(small, tp.chameleon_engine(policy, sizing, is_cached), adapters, trace)
        finally:
            undo()
        m = tp.metrics(run.records, tp.CHAMELEON_SLO_S)
        cut = tp.pct(tp.ttfts(run.records), top)
        tail = [r for r in run.records if r.ttft_s is not None and r.ttft_s >= cut]
        totals = dict.fromkeys(REASONS, 0.0)
        for record in tail:
            for why, seconds in split_ttft(record, recorder).items():
                totals[why] += seconds
        total = sum(totals.values()) or 1.0
        out[config] = {
            "p99_s": m["ttft_p99_s"], "p50_s": m["ttft_p50_s"], "goodput_rps": m["goodput_rps"],
            "num_tail": len(tail), "tail_share": {k: v / total for k, v in totals.items()},
            "tail_mean_ttft_s": total / max(len(tail), 1),
        }  # fmt: skip
        shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in totals.items())
        print(
            f"load {load:g} seed {seed} {config}: P99 {m['ttft_p99_s']:.3f} s P50 {m['ttft_p50_s']:.3f} s "
            f"goodput {m['goodput_rps']:.2f}/s | tail ({len(tail)} req, mean {total / max(len(tail), 1):.2f} s): "
            f"{shares}",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=tp.DEFAULT_SCALE.num_requests)
    p.add_argument("--configs", default="fifo,mq_tokens")
    p.add_argument("--top", type=float, default=99.0, help="percentile from which a request is in the tail")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    print(f"CPU: {cpu_model()} (twin: simulated time)", flush=True)
    result = audit(args.load, args.seed, args.num_requests, args.configs.split(","), args.top)
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
