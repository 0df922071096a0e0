"""`lorahost report billing|slo`: the admin reports, computed straight from the database."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Billing and SLO reports.", no_args_is_help=True)


def _period(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    from registry.usage import as_utc
    from registry.usage_reports import default_period

    lo, hi = default_period()
    try:
        return (
            as_utc(datetime.fromisoformat(start)) if start else lo,
            as_utc(datetime.fromisoformat(end)) if end else hi,
        )
    except ValueError as exc:
        raise typer.BadParameter(
            f"dates must be ISO 8601 (e.g. 2026-11-01 or 2026-11-01T10:00): {exc}"
        ) from exc


def _session(data_dir: Path | None):  # type: ignore[no-untyped-def]
    from registry.db import make_engine, make_session_factory
    from settings import Settings

    settings = Settings(data_dir=data_dir) if data_dir else Settings()
    return make_session_factory(make_engine(settings.resolved_database_url()))()


@app.command("billing")
def billing(
    start: Annotated[
        str | None, typer.Option(help="Period start (ISO date/time, UTC); default 30 days ago")
    ] = None,
    end: Annotated[str | None, typer.Option(help="Period end, exclusive; default now")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, json or csv")] = "table",
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data dir (else LORAHOST_* settings)")
    ] = None,
) -> None:
    """Per-tenant invoice lines for a period."""
    from rich.console import Console
    from rich.table import Table

    from registry.billing import billing_report, invoice_to_json, invoices_to_csv

    lo, hi = _period(start, end)
    with _session(data_dir) as session:
        lines = billing_report(session, lo, hi)
    if fmt == "json":
        typer.echo(json.dumps([invoice_to_json(line) for line in lines], indent=2))
    elif fmt == "csv":
        typer.echo(invoices_to_csv(lines), nl=False)
    elif fmt == "table":
        table = Table(title=f"Billing {lo:%Y-%m-%d %H:%M} .. {hi:%Y-%m-%d %H:%M} UTC")
        for col in ("tenant", "plan", "requests", "prompt tok", "completion tok", "adapter-days", "total"):
            table.add_column(col, justify="right" if col not in ("tenant", "plan") else "left")
        for line in lines:
            table.add_row(
                line.tenant_name,
                line.plan_name,
                str(line.num_requests),
                str(line.prompt_tokens),
                str(line.completion_tokens),
                f"{line.adapter_days:.2f}",
                f"{line.total:.6f}",
            )
        Console().print(table)
    else:
        raise typer.BadParameter("--format must be table, json or csv")


@app.command("slo")
def slo(
    out: Annotated[Path, typer.Option(help="Directory for slo_<group>.csv/json and the PNG plots")],
    start: Annotated[str | None, typer.Option(help="Period start (ISO, UTC); default 30 days ago")] = None,
    end: Annotated[str | None, typer.Option(help="Period end, exclusive; default now")] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data dir (else LORAHOST_* settings)")
    ] = None,
) -> None:
    """SLO tables (by tenant, adapter, hour) and plots: latency percentiles over time, attainment by tenant."""
    from rich.console import Console
    from rich.table import Table

    from lorahost.slo_plots import plot_attainment_by_tenant, plot_latency_over_time
    from registry.models import Tenant
    from registry.usage import GROUP_BYS
    from registry.usage_reports import SloGroup, slo_report

    lo, hi = _period(start, end)
    out.mkdir(parents=True, exist_ok=True)
    with _session(data_dir) as session:
        tables = {g: slo_report(session, lo, hi, g) for g in GROUP_BYS}
        names = {t.id: t.name for t in session.query(Tenant)}
    columns = [f.name for f in fields(SloGroup)]
    for group_by, groups in tables.items():
        with (out / f"slo_{group_by}.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(asdict(g) for g in groups)
        (out / f"slo_{group_by}.json").write_text(json.dumps([asdict(g) for g in groups], indent=2))
    plot_latency_over_time(tables["hour"], out / "latency_over_time.png")
    plot_attainment_by_tenant(tables["tenant"], names, out / "attainment_by_tenant.png")
    table = Table(title="SLO by tenant")
    for col in ("tenant", "requests", "ok", "errors", "attainment", "TTFT p50/p99 ms", "TPOT p50/p99 ms"):
        table.add_column(col)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    for g in tables["tenant"]:
        table.add_row(
            names.get(g.key, g.key),
            str(g.num_requests),
            str(g.num_ok),
            str(g.num_error),
            "-" if g.attainment is None else f"{100 * g.attainment:.1f}%",
            f"{fmt(g.ttft_p50)}/{fmt(g.ttft_p99)}",
            f"{fmt(g.tpot_p50)}/{fmt(g.tpot_p99)}",
        )
    Console().print(table)
    typer.echo(f"wrote SLO tables and plots to {out}")
