"""PNG plots for the SLO report: latency percentiles over time and attainment by tenant (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from registry.usage_reports import SloGroup


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_over_time(hourly: Sequence[SloGroup], out_path: Path) -> Path:
    """Line plot of p50/p90/p99 TTFT and TPOT per hour."""
    plt = _pyplot()
    fig, (ax_ttft, ax_tpot) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    hours = [g.key[:13].replace("T", " ") for g in hourly]
    for label, attr_prefix, ax in (("TTFT", "ttft", ax_ttft), ("TPOT", "tpot", ax_tpot)):
        for pct in (50, 90, 99):
            values = [getattr(g, f"{attr_prefix}_p{pct}") for g in hourly]
            ax.plot(
                hours, [v if v is not None else float("nan") for v in values], marker="o", label=f"p{pct}"
            )
        ax.set_ylabel(f"{label} (ms)")
        ax.legend(loc="upper left")
        ax.grid(alpha=0.3)
    ax_tpot.set_xlabel("hour (UTC)")
    ax_tpot.tick_params(axis="x", rotation=45)
    fig.suptitle("Latency percentiles over time")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def plot_attainment_by_tenant(groups: Sequence[SloGroup], names: dict[str, str], out_path: Path) -> Path:
    """Bar chart of SLO attainment (%) per tenant."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(groups) + 2), 4))
    labels = [names.get(g.key, g.key[:8]) for g in groups]
    values = [100 * g.attainment if g.attainment is not None else 0.0 for g in groups]
    bars = ax.bar(labels, values, color="tab:blue")
    for bar, g in zip(bars, groups):
        ax.annotate(
            f"{bar.get_height():.0f}% (n={g.num_ok + g.num_error})",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylim(0, 110)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title("SLO attainment by tenant")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
