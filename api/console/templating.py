"""The console's Jinja2 environment (autoescaped templates under templates/) and its number formats."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from api.console.auth import ConsoleUser

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} ms"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _money(value: Decimal | str | float | None) -> str:
    return "–" if value is None else f"{Decimal(str(value)):,.6f}"


def _moment(value: datetime | float | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, tz=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _chart_json(config: dict[str, Any]) -> str:
    return json.dumps(config, separators=(",", ":"), default=str)


def make_templates() -> Jinja2Templates:
    """The console's templates with its filters."""
    templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
    templates.env.filters.update(ms=_ms, pct=_pct, money=_money, moment=_moment, chart_json=_chart_json)
    return templates


TEMPLATES = make_templates()


def render(
    request: Request, name: str, user: ConsoleUser | None, status_code: int = 200, **context: Any
) -> HTMLResponse:
    """Render one page or fragment; every template gets the user and its CSRF token."""
    values = {"user": user, "csrf_token": user.csrf_token if user else None, **context}
    return TEMPLATES.TemplateResponse(request, name, values, status_code=status_code)
