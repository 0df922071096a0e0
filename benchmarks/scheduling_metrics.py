"""The scheduling benchmark's metrics (pure): queueing share per size class, one load point's numbers, the
throughput at a TTFT SLO, the summary against Chameleon's targets, and the text tables.

Definitions (also in benchmarks/README.md):
- queueing = arrival -> the engine's first step that ran any of the request's tokens (`first_scheduled`;
  waiting for its adapter's copy counts as queueing); E2E = arrival -> last token. The queueing share of a
  size class is sum(queueing) / sum(E2E) over the class's completed requests (a ratio of sums, so a few
  very short requests do not dominate it).
- a load point is *finished* when every request completed within the drain limit (`drain_limit_s`: a
  share of the arrival span, so finishing means keeping up with the offered rate); TTFT percentiles are over
  the requests that got a first token (an unfinished point's are optimistic and flagged by `is_finished`).
- throughput at the SLO: walking up the sweep, the last rate that is finished with P99 TTFT <= SLO before
  the first that is not; when that next point is finished (P99 above the SLO) the rate is interpolated
  linearly between the two points at the SLO; when it is unfinished the last passing rate is kept (no
  P99 to interpolate to). None when the lowest rate already misses; the highest rate (a lower bound, status
  "all_pass") when every rate meets it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from scheduling_workload import SIZE_CLASSES

TARGET_P99_TTFT_REDUCTION = 0.80  # Chameleon: >= 80% lower P99 TTFT than FIFO at FIFO's highest finished load
TARGET_SLO_THROUGHPUT_RATIO = 1.5  # >= 1.5x FIFO's throughput at the TTFT SLO
TARGET_MAX_QUEUEING_SHARE = 0.10  # no size class above 10% queueing share of E2E
COMPLETED_REASONS = ("length", "stop")
RUN_KEYS = (
    "num_requests",
    "completed",
    "num_incomplete",
    "num_errors",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "ttft_ms_mean",
    "tbt_ms_p99",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "throughput_rps",
    "out_tok_s",
    "hit_rate",
    "request_hit_rate",
)


def drain_limit_s(span_s: float, factor: float, min_s: float) -> float:
    """How long after the last arrival a load point may run: `factor` x the arrival span, at least `min_s`.
    A system that needs more than (1 + factor) x the span to serve the point leaves requests unfinished."""
    if factor < 0 or min_s < 0 or span_s < 0:
        raise ValueError(f"drain factor, minimum and span must be >= 0, got {factor}, {min_s}, {span_s}")
    return max(min_s, factor * span_s)


def system_label(policy: str, is_caching: bool) -> str:
    """e.g. "fifo/cache", "sjf/no-cache"."""
    return f"{policy}/{'cache' if is_caching else 'no-cache'}"


def _ratio(num: float | None, den: float | None, digits: int = 4) -> float | None:
    return None if num is None or not den else round(num / den, digits)


def is_completed(record: dict[str, Any]) -> bool:
    """The request produced all its tokens before the drain limit."""
    return record.get("finish") is not None and record.get("finish_reason") in COMPLETED_REASONS


def queueing_by_class(
    records: Iterable[dict[str, Any]], class_of: dict[int, str]
) -> dict[str, dict[str, Any]]:
    """Per size class (SIZE_CLASSES order): completed requests, queueing share of E2E (ratio of sums), mean
    queueing and E2E in ms. records: `index`, `arrival`, `first_scheduled`, `finish` (seconds),
    `finish_reason`; class_of: request index -> size class."""
    sums = {c: [0, 0.0, 0.0] for c in SIZE_CLASSES}  # count, queueing s, e2e s
    for r in records:
        if not is_completed(r) or r.get("first_scheduled") is None:
            continue
        entry = sums[class_of[r["index"]]]
        entry[0] += 1
        entry[1] += max(0.0, r["first_scheduled"] - r["arrival"])
        entry[2] += r["finish"] - r["arrival"]
    out = {}
    for name, (num, queueing, e2e) in sums.items():
        out[name] = {
            "num_completed": num,
            "queueing_share": _ratio(queueing, e2e),
            "queueing_ms_mean": round(1000 * queueing / num, 2) if num else None,
            "e2e_ms_mean": round(1000 * e2e / num, 2) if num else None,
        }
    return out


def max_queueing_share(by_class: dict[str, dict[str, Any]]) -> float | None:
    """The largest queueing share over the size classes that have completed requests."""
    shares = [c["queueing_share"] for c in by_class.values() if c["queueing_share"] is not None]
    return max(shares) if shares else None


def run_metrics(result: dict[str, Any], class_of: dict[int, str]) -> dict[str, Any]:
    """One (system, load) point: the replay's summary numbers plus finished flag, queueing per size class and
    the engine's adapter/preemption counters."""
    if "error" in result or "records" not in result:
        return {"is_finished": False, "error": result.get("error", "no records"), **_log_info(result)}
    by_class = queueing_by_class(result["records"], class_of)
    stats = result.get("stats", {})
    return {
        **{k: result.get(k) for k in RUN_KEYS},
        "is_finished": result["num_incomplete"] == 0 and result["num_errors"] == 0,
        "queueing_by_class": by_class,
        "queueing_share_max": max_queueing_share(by_class),
        "num_preemptions": stats.get("num_preemptions"),
        "num_adapter_loads": stats.get("num_adapter_loads"),
        "num_adapter_evictions": stats.get("num_adapter_evictions"),
        "replay_wall_s": result.get("replay_wall_s"),
    }


def _log_info(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result[k] for k in ("log", "log_tail") if k in result}


# ------------------------------------------------------------------------------------------ SLO


def _passes(point: dict[str, Any], slo_ms: float) -> bool:
    p99 = point.get("ttft_ms_p99")
    return bool(point.get("is_finished")) and p99 is not None and p99 <= slo_ms


def throughput_at_slo(points: Sequence[dict[str, Any]], slo_ms: float) -> dict[str, Any]:
    """The highest offered rate (req/s) whose P99 TTFT meets `slo_ms` (see the module docstring).

    points: one per swept rate with `rate_rps`, `ttft_ms_p99`, `is_finished`. Returns `rps` and `status`
    ("interpolated" | "last_passing" | "all_pass" | "none_pass" | "no_points").
    """
    ordered = sorted(points, key=lambda p: p["rate_rps"])
    if not ordered:
        return {"rps": None, "status": "no_points"}
    if not _passes(ordered[0], slo_ms):
        return {"rps": None, "status": "none_pass"}
    for below, above in itertools.pairwise(ordered):
        if _passes(above, slo_ms):
            continue
        if not above.get("is_finished") or above.get("ttft_ms_p99") is None:
            return {"rps": round(below["rate_rps"], 4), "status": "last_passing"}
        y1, y2 = below["ttft_ms_p99"], above["ttft_ms_p99"]
        share = (slo_ms - y1) / (y2 - y1) if y2 > y1 else 0.0
        rps = below["rate_rps"] + share * (above["rate_rps"] - below["rate_rps"])
        return {"rps": round(rps, 4), "status": "interpolated"}
    return {"rps": round(ordered[-1]["rate_rps"], 4), "status": "all_pass"}


def highest_finished(points: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest-rate point before the first unfinished one (walking up the sweep); None if the lowest is
    unfinished."""
    best = None
    for point in sorted(points, key=lambda p: p["rate_rps"]):
        if not point.get("is_finished"):
            break
        best = point
    return best


# ------------------------------------------------------------------------------------------ summary


def _at_load(points: Sequence[dict[str, Any]], load: float) -> dict[str, Any] | None:
    return next((p for p in points if abs(p["load"] - load) < 1e-9), None)


def compare_with(
    points: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]], slo_ms: float
) -> dict[str, Any]:
    """A system against a FIFO baseline: P99 TTFT reduction at the baseline's highest finished load, the
    throughput ratio at the SLO, and the system's queueing shares at that load."""
    ref = highest_finished(baseline)
    mine = _at_load(points, ref["load"]) if ref is not None else None
    reduction = None
    if ref is not None and mine is not None and mine.get("ttft_ms_p99") is not None and ref["ttft_ms_p99"]:
        reduction = round(1.0 - mine["ttft_ms_p99"] / ref["ttft_ms_p99"], 4)
    rps, ref_rps = throughput_at_slo(points, slo_ms)["rps"], throughput_at_slo(baseline, slo_ms)["rps"]
    by_class = (mine or {}).get("queueing_by_class")
    share = max_queueing_share(by_class) if by_class else None
    return {
        "at_load": None if ref is None else ref["load"],
        "is_finished_there": None if mine is None else bool(mine.get("is_finished")),
        "p99_ttft_ms": None if mine is None else mine.get("ttft_ms_p99"),
        "baseline_p99_ttft_ms": None if ref is None else ref["ttft_ms_p99"],
        "p99_ttft_reduction": reduction,
        "slo_throughput_rps": rps,
        "baseline_slo_throughput_rps": ref_rps,
        "slo_throughput_ratio": _ratio(rps, ref_rps, 3),
        "queueing_share_by_class": None
        if not by_class
        else {c: v["queueing_share"] for c, v in by_class.items()},
        "max_queueing_share": share,
    }


def _meets(value: float | None, test: Callable[[float], bool]) -> bool | None:
    return None if value is None else test(value)


def summarize_systems(
    points_by_system: dict[str, list[dict[str, Any]]],
    policies: Sequence[str],
    caches: Sequence[bool],
    slo_ms: float,
) -> dict[str, Any]:
    """Every system against FIFO with the same cache setting and against FIFO without the cache (the S-LoRA
    baseline), with Chameleon's three targets checked on the same-cache comparison."""
    systems: dict[str, Any] = {}
    slora = points_by_system.get(system_label("fifo", False))
    for is_caching in caches:
        fifo = points_by_system.get(system_label("fifo", is_caching))
        for policy in policies:
            label = system_label(policy, is_caching)
            points = points_by_system.get(label)
            if points is None:
                continue
            entry: dict[str, Any] = {"slo": throughput_at_slo(points, slo_ms)}
            if fifo is not None:
                vs = compare_with(points, fifo, slo_ms)
                vs["meets_p99_ttft_target"] = _meets(
                    vs["p99_ttft_reduction"], lambda x: x >= TARGET_P99_TTFT_REDUCTION
                )
                vs["meets_slo_throughput_target"] = _meets(
                    vs["slo_throughput_ratio"], lambda x: x >= TARGET_SLO_THROUGHPUT_RATIO
                )
                vs["meets_queueing_target"] = _meets(
                    vs["max_queueing_share"], lambda x: x <= TARGET_MAX_QUEUEING_SHARE
                )
                entry["vs_fifo_same_cache"] = vs
            if slora is not None and label != system_label("fifo", False):
                entry["vs_fifo_no_cache"] = compare_with(points, slora, slo_ms)
            systems[label] = entry
    return {
        "targets": {
            "p99_ttft_reduction_vs_fifo": TARGET_P99_TTFT_REDUCTION,
            "slo_throughput_ratio_vs_fifo": TARGET_SLO_THROUGHPUT_RATIO,
            "max_queueing_share": TARGET_MAX_QUEUEING_SHARE,
        },
        "slo_ttft_ms": round(slo_ms, 2),
        "systems": systems,
    }


# ------------------------------------------------------------------------------------------ tables


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width text table."""
    cells = [list(header)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _share(point: dict[str, Any], size: str) -> Any:
    by_class = point.get("queueing_by_class") or {}
    return (by_class.get(size) or {}).get("queueing_share")


def runs_table(points: Sequence[dict[str, Any]]) -> str:
    """One row per (load, system)."""
    header = (
        "load",
        "rps",
        "system",
        "done",
        "ttft_p50",
        "ttft_p99",
        "tbt_p99",
        "thr_rps",
        "hit",
        "q_small",
        "q_med",
        "q_large",
        "K",
        "foreign",
    )
    rows = [
        (
            p["load"],
            p["rate_rps"],
            p["system"],
            f"{p.get('completed', 0)}/{p.get('num_requests', '?')}"
            + ("" if p.get("is_finished") else " UNFIN"),
            p.get("ttft_ms_p50"),
            p.get("ttft_ms_p99"),
            p.get("tbt_ms_p99"),
            p.get("throughput_rps"),
            p.get("request_hit_rate"),
            _share(p, "small"),
            _share(p, "medium"),
            _share(p, "large"),
            (p.get("policy_state") or {}).get("num_queues"),
            p.get("foreign_busy_cores_during"),
        )
        for p in sorted(points, key=lambda x: (x["load"], x["system"]))
    ]
    return format_table(header, rows)


def summary_table(summary: dict[str, Any]) -> str:
    """One row per system: SLO throughput and the three targets against FIFO with the same cache setting."""
    header = (
        "system",
        "slo_rps",
        "slo_status",
        "at_load",
        "p99_ttft_red",
        "ok",
        "slo_ratio",
        "ok",
        "max_q_share",
        "ok",
        "vs_slora_p99_red",
        "vs_slora_slo_ratio",
    )
    rows = []
    for label, entry in summary["systems"].items():
        vs = entry.get("vs_fifo_same_cache", {})
        slora = entry.get("vs_fifo_no_cache", {})
        rows.append(
            (
                label,
                entry["slo"]["rps"],
                entry["slo"]["status"],
                vs.get("at_load"),
                vs.get("p99_ttft_reduction"),
                vs.get("meets_p99_ttft_target"),
                vs.get("slo_throughput_ratio"),
                vs.get("meets_slo_throughput_target"),
                vs.get("max_queueing_share"),
                vs.get("meets_queueing_target"),
                slora.get("p99_ttft_reduction"),
                slora.get("slo_throughput_ratio"),
            )
        )
    return format_table(header, rows)


def report_text(report: dict[str, Any]) -> str:
    """The readable part of a run's report: workload, predictor, calibration, then the two tables."""
    pred, cal, targets = report["predictor"], report["calibration"], report["summary"]["targets"]
    held_out = json.dumps(pred["held_out"])
    lines = [
        f"workload: {json.dumps(report['workload'])}",
        f"predictor (LengthPredictor hgb, {pred['num_train']} train): held-out {held_out}; "
        + f"on the benchmark requests MAE {pred['workload']['mae']}",
        f"engine: {json.dumps(report['engine_common'])}",
        f"calibration ({cal['system']}): unloaded TTFT mean {cal['unloaded_ttft_ms_mean']} ms, capacity "
        + f"{cal['capacity_rps']} req/s, SLO (P99 TTFT) {cal['slo_ttft_ms']} ms",
    ]
    if report["skipped_policies"]:
        lines.append(f"skipped (not in BATCH_POLICIES): {', '.join(report['skipped_policies'])}")
    lines += [
        "",
        "per load point (ms; thr = completed req/s; hit = share of requests whose adapter was on the device "
        + "at arrival; q_* = queueing share of E2E per size class; K = the policy's queues (multiqueue); "
        + "foreign = other processes' busy cores):",
        runs_table(report["points"]),
        "",
        "summary vs FIFO with the same cache setting (targets: P99 TTFT reduction >= "
        + f"{targets['p99_ttft_reduction_vs_fifo']}, SLO throughput ratio >= "
        + f"{targets['slo_throughput_ratio_vs_fifo']}, max queueing share <= "
        + f"{targets['max_queueing_share']}); vs_slora = vs fifo/no-cache:",
        summary_table(report["summary"]),
        "",
        f"JSON: {report['config']['out']}  (wall {report['wall_s']} s)",
    ]
    return "\n".join(lines)
