"""The demo's look at the web console: sign in as the tenant and as the operator (the form, then the session
cookie, as a browser does) and read the pages that show what the demo just did."""

from __future__ import annotations

import re

import httpx
from rich.console import Console

console = Console()
# The sign-in form's token: bound to the nonce in the pre-session cookie the same GET set.
LOGIN_TOKEN_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def signed_in(base_url: str, key: str) -> httpx.Client:
    """A client signed in to the console with `key` (its cookie jar holds the session)."""
    client = httpx.Client(base_url=base_url, timeout=60, follow_redirects=True)
    form = client.get("/console/login")
    form.raise_for_status()
    token = LOGIN_TOKEN_RE.search(form.text)
    if token is None:
        raise RuntimeError("console sign-in form has no token")
    response = client.post("/console/login", data={"key": key, "csrf_token": token.group(1)})
    response.raise_for_status()
    if "/console/login" in str(response.url):
        raise RuntimeError(f"console sign-in failed: {response.status_code}")
    return client


def visit_console(base_url: str, key: str, admin_key: str) -> None:
    """Open the tenant's adapters and usage and the operator's billing page; print what they show."""
    tenant, operator = signed_in(base_url, key), signed_in(base_url, admin_key)
    try:
        adapters, usage = tenant.get("/console/adapters"), tenant.get("/console/usage")
        billing = operator.get("/console/admin/billing")
    finally:
        tenant.close()
        operator.close()
    for page in (adapters, usage, billing):
        page.raise_for_status()
    num_versions = len(re.findall(r'class="badge badge-ready"', adapters.text))
    num_usage_rows = usage.text.count("<tr><td>")
    num_invoice_lines = billing.text.count("<tr><td>")
    console.print(
        f"[bold]console[/] {base_url}/console (sign in with the tenant or the admin key): "
        f"{num_versions} ready adapter versions, {num_usage_rows} usage rows (day x adapter), "
        f"{num_invoice_lines} invoice lines"
    )
