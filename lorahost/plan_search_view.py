"""`search_table`: the planner search's answer (`lorahost plan`'s "search", twin/planner/search.py) as text: the
chosen deployment with its margin under the SLO, and a rich table of it and the runners-up with why each lost."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = (
    "workers",
    "cost/h",
    "max_num_seqs",
    "memory",
    "batch",
    "placement",
    "measured s",
    "margin",
    "requests",
    "verdict",
    "why not chosen",
)


def search_table(search: dict[str, Any], *, width: int = 160) -> str:
    """The search as plain text (a headline, the table, the budget and notes)."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(_headline(search), highlight=False)
    rows = ([search["chosen"]] if search["chosen"] else []) + search["runners_up"]
    if rows:
        table = Table(title=f"candidates checked in the cluster twin (SLO {search['slo']})")
        for name in COLUMNS:
            table.add_column(
                name,
                justify="left"
                if name in ("memory", "batch", "placement", "verdict", "why not chosen")
                else "right",
            )
        for row in rows:
            table.add_row(*_cells(row, "chosen" if row is search["chosen"] else row["why"]))
        console.print(table)
    pruned = ", ".join(f"{n} {reason}" for reason, n in search["pruned"].items()) or "none"
    console.print(
        f"search: {search['num_checks']} of {search['max_checks']} twin checks, {search['search_s']:.1f} of "
        f"{search['max_search_s']:g} s; candidates {search['num_candidates']}, pruned by the estimate: {pruned}",
        highlight=False,
    )
    for note in search["notes"]:
        console.print(f"search note: {note}", highlight=False)
    output = console.file
    assert isinstance(output, io.StringIO)
    return output.getvalue().rstrip("\n")


def _headline(search: dict[str, Any]) -> str:
    chosen = search["chosen"]
    if chosen is None:
        return f"search: {search['verdict'].upper()} (SLO {search['slo']})"
    return (
        f"search: chosen {chosen['num_workers']} workers (cost {chosen['cost_per_hour']:g}/h), "
        f"max_num_seqs {chosen['max_num_seqs']}, {_memory(chosen)}, {chosen['batch_policy']}, placement "
        f"{chosen['placement']}: {chosen['slo_metric']} {chosen['measured_s']:.3f} s vs SLO {search['slo']}, "
        f"margin {chosen['margin_pct']:+.1f}%"
    )


def _cells(row: dict[str, Any], why: str) -> list[str]:
    margin = row["margin_pct"]
    measured = row["measured_s"]
    return [
        str(row["num_workers"]),
        f"{row['cost_per_hour']:g}",
        str(row["max_num_seqs"]),
        _memory(row),
        row["batch_policy"],
        row["placement"],
        "-" if measured is None else f"{measured:.3f}",
        "-" if margin is None else f"{margin:+.1f}%",
        str(row["num_requests"]),
        row["verdict"],
        why,
    ]


def _memory(row: dict[str, Any]) -> str:
    fraction = row["adapter_fraction"]
    return row["memory_mode"] if fraction is None else f"{row['memory_mode']} {fraction * 100:g}%"
