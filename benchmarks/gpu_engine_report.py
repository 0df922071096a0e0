"""The rows, ratios, floors and the one table of benchmarks/gpu_engine_bench.py (torch-free).

A row is (model, number of adapters, system): "lorahost" (the native engine; with adapters: LoRA) or "hf"
(transformers; with adapters: + peft), measured by the peers (benchmarks/peers/gpu_lorahost.py,
gpu_hf_peft.py). Columns:
- adapters: the row's adapter set; loaded: how many the system held (lorahost: the set, on the device;
  transformers + peft: the batches' adapters only); distinct: adapters in one step;
- tok/s: output tokens of the batch / wall time of a timed run (prefill + every decode step), median run;
- step ms: median decode step of that run (the batch's size, default 32);
- vs base: tok/s / the same system's base-model row of the same model (1.00 on base rows);
- vs hf: lorahost tok/s / transformers (+ peft) tok/s of the same model and adapters;
- floor ms: the HBM floor of a decode step: bytes it must read (every weight once, the LM head included; the
  batch's distinct adapters; K and V of each sequence at the median step's context, prompt + max_tokens / 2)
  / the card's measured bandwidth (benchmarks/decode_floor.py: a device-to-device copy on CUDA);
- vs floor: step ms / floor ms (1.0 = the step runs at the card's memory bandwidth);
- card: where the row ran (torch.cuda.get_device_name).
"""

from __future__ import annotations

from typing import Any

from decode_floor import ELEMENT_BYTES, kv_elements, step_floor, weight_elements
from gpu_engine_workload import SHAPES, adapter_rank, adapter_set_bytes, batch_adapters, lora_elements

LABELS = {
    ("lorahost", False): "lorahost base",
    ("lorahost", True): "lorahost + LoRA",
    ("hf", False): "transformers",
    ("hf", True): "transformers + peft",
}
COLUMNS = (
    ("model", "model", "{}"),
    ("adapters", "num_adapters", "{}"),
    ("loaded", "num_adapters_loaded", "{}"),
    ("distinct", "num_distinct", "{}"),
    ("system", "label", "{}"),
    ("tok/s", "tok_s", "{:,.0f}"),
    ("step ms", "step_ms", "{:.2f}"),
    ("vs base", "vs_base", "{:.2f}"),
    ("vs hf", "vs_hf", "{:.2f}"),
    ("floor ms", "floor_ms", "{:.2f}"),
    ("vs floor", "vs_floor", "{:.1f}"),
    ("card", "device_name", "{}"),
)


def planned_rows(models: list[str], counts: list[int], systems: list[str]) -> list[tuple[str, int, str]]:
    """(model, num_adapters, system) of every row, in table order (base rows first within a model)."""
    return [(m, n, s) for m in models for n in [0, *counts] for s in systems]


def decode_floor_of(
    model: str, num_adapters: int, batch: int, prompt_len: int, max_tokens: int, dtype: str, bandwidth: float
) -> dict[str, Any]:
    """The floor of the row's median decode step (module doc) at `bandwidth` bytes/s."""
    cfg = SHAPES[model].hf_config()
    distinct = set(batch_adapters(num_adapters, batch))
    adapter_elems = sum(lora_elements(cfg, adapter_rank(i)) for i in distinct)
    kv_elems = kv_elements(cfg, [prompt_len + max_tokens // 2] * batch)
    return step_floor(weight_elements(cfg), adapter_elems, kv_elems, ELEMENT_BYTES[dtype], bandwidth)


def build_rows(
    lines: list[dict[str, Any]],
    plan: list[tuple[str, int, str]],
    workload: dict[str, Any],
    bandwidth: float | None,
    errors: dict[tuple[str, str], str],
) -> list[dict[str, Any]]:
    """One row per planned (model, adapters, system): the peer's line with its ratios and floor, or the reason
    it is missing (`errors[(model, system)]`, else "not measured")."""
    found = {(line["model"], line["num_adapters"], line["system"]): line for line in lines if "model" in line}
    rows = []
    for model, num_adapters, system in plan:
        line = found.get((model, num_adapters, system))
        row: dict[str, Any] = {
            "model": model,
            "num_adapters": num_adapters,
            "num_distinct": len(set(batch_adapters(num_adapters, workload["batch"]))),
            "system": system,
            "label": LABELS[(system, num_adapters > 0)],
        }
        if line is None:
            row["error"] = errors.get((model, system), "not measured")
        else:
            row.update(
                tok_s=line["out_tok_s"],
                step_ms=line.get("decode_step_ms_median"),
                device_name=line["device_name"],
                num_adapters_loaded=line.get("num_adapters_loaded", 0),
            )
            row["line"] = line
            if bandwidth is not None:
                floor = decode_floor_of(
                    model,
                    num_adapters,
                    workload["batch"],
                    workload["prompt_len"],
                    workload["max_tokens"],
                    line["dtype"],
                    bandwidth,
                )
                row["floor"] = floor
                row["floor_ms"] = floor["floor_ms"]
        rows.append(row)
    _add_ratios(rows)
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    by_key = {(r["model"], r["num_adapters"], r["system"]): r for r in rows}
    for r in rows:
        base = by_key.get((r["model"], 0, r["system"]), {})
        r["vs_base"] = _ratio(r.get("tok_s"), base.get("tok_s"))
        if r["system"] != "hf":
            hf = by_key.get((r["model"], r["num_adapters"], "hf"), {})
            r["vs_hf"] = _ratio(r.get("tok_s"), hf.get("tok_s"))
            if "line" in r and "line" in hf:  # the same weights: greedy tokens agree unless rounding differs
                r["same_first_tokens_as_hf"] = r["line"].get("first_tokens") == hf["line"].get("first_tokens")
        r["vs_floor"] = _ratio(r.get("step_ms"), r.get("floor_ms"))


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as one aligned text table ("-" where a value is missing; a missing row says why)."""
    cells = [[title for title, _, _ in COLUMNS]]
    for r in rows:
        cells.append([_cell(r.get(key), fmt) for _, key, fmt in COLUMNS])
        if "error" in r:
            cells[-1][-1] = f"({r['error']})"
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def adapter_sets(models: list[str], counts: list[int], element_size: int) -> dict[str, dict[int, int]]:
    """model -> adapter count -> bytes of that set's weights (lorahost holds all of them on the device)."""
    return {m: {n: adapter_set_bytes(SHAPES[m].hf_config(), n, element_size) for n in counts} for m in models}


def kernel_choices(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """model -> the kernel forms lorahost ran with (its last row's runner stats) and where each came from."""
    out: dict[str, Any] = {}
    for line in lines:
        stats = line.get("runner_stats") if line.get("system") == "lorahost" else None
        if stats:
            out[line["model"]] = {"forms": stats["kernel_choices"], "sources": stats["kernel_choice_sources"]}
    return out
