"""Chart.js configurations built on the server as plain data: a page puts one in a `<canvas data-chart>`
attribute and static/console.js draws it (no inline script, so the CSP stays strict). Colours are assigned by
console.js in dataset order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
Number = float | int | None


def series_by(
    points: Iterable[T],
    x_of: Callable[[T], str],
    series_of: Callable[[T], str],
    value_of: Callable[[T], Number],
) -> tuple[list[str], dict[str, list[Number]]]:
    """Sorted x labels and one value list per series (None where a series has no point at an x)."""
    points = list(points)
    labels = sorted({x_of(p) for p in points})
    index = {label: i for i, label in enumerate(labels)}
    series: dict[str, list[Number]] = {}
    for p in points:
        values = series.setdefault(series_of(p), [None] * len(labels))
        values[index[x_of(p)]] = value_of(p)
    return labels, dict(sorted(series.items()))


def chart(
    kind: str,
    labels: Sequence[str],
    series: dict[str, list[Number]],
    *,
    title: str,
    y_title: str,
    is_stacked: bool = False,
    y_max: float | None = None,
) -> dict[str, Any]:
    """One Chart.js config: a `line` or `bar` chart of the series over the labels."""
    y_axis: dict[str, Any] = {
        "beginAtZero": True,
        "stacked": is_stacked,
        "title": {"display": True, "text": y_title},
    }
    if y_max is not None:
        y_axis["max"] = y_max
    return {
        "type": kind,
        "data": {
            "labels": list(labels),
            "datasets": [
                {"label": name, "data": values, "spanGaps": True} for name, values in series.items()
            ],
        },
        "options": {
            "animation": False,
            "responsive": True,
            "maintainAspectRatio": False,
            "plugins": {"title": {"display": True, "text": title}},
            "scales": {"x": {"stacked": is_stacked}, "y": y_axis},
        },
    }
