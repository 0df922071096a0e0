"""The console in a real browser (Debian's headless Chromium driven by Playwright) against a real embedded
server: a tenant signs in, drops an adapter folder, watches it become ready, runs the playground and sees its
usage; the operator sees the bill and downloads the CSV; another tenant can open none of it and a post without
the CSRF token is refused. No page logs a Content-Security-Policy violation.

Screenshots of every page go to LORAHOST_CONSOLE_SCREENSHOTS (default: the test's temporary directory).
"""

from __future__ import annotations

import base64
import csv
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.console.browser_support import ADMIN_KEY, Served, chromium_path, serve

pytestmark = pytest.mark.slow  # starts lorahost serve and Chromium
sync_api = pytest.importorskip("playwright.sync_api")
WAIT_MS = 120_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("console-browser")
    yield from serve(root / "data", base_model_dir, root / "serve.log")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("LORAHOST_CONSOLE_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


class Tab:
    """A browser context (its own cookies) with one page, recording CSP violations."""

    def __init__(self, browser: Any, url: str) -> None:
        self.context = browser.new_context(
            base_url=url, viewport={"width": 1400, "height": 900}, accept_downloads=True
        )
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.violations: list[str] = []
        self.page.on("console", self._on_console)

    def _on_console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.violations.append(message.text)

    def sign_in(self, key: str) -> None:
        self.page.goto("/console")
        assert "/console/login" in self.page.url
        self.page.fill("input[name=key]", key)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state()

    def shot(self, where: Path, name: str) -> None:
        self.page.screenshot(path=str(where / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


def _drop_folder(page: Any, adapter_dir: Path) -> None:
    """Drop the PEFT folder's files on the drop zone, as a drag from the file manager does."""
    files = [
        {"name": name, "data": base64.b64encode((adapter_dir / name).read_bytes()).decode()}
        for name in ("adapter_config.json", "adapter_model.safetensors")
    ]
    transfer = page.evaluate_handle(
        """(files) => {
            const dt = new DataTransfer();
            for (const f of files) {
                const bytes = Uint8Array.from(atob(f.data), (c) => c.charCodeAt(0));
                dt.items.add(new File([bytes], f.name));
            }
            return dt;
        }""",
        files,
    )
    page.dispatch_event("#dropzone", "drop", {"dataTransfer": transfer})


def _reload_until(page: Any, predicate: Any, timeout_s: float = 60.0) -> None:
    """Reload the page until `predicate()` holds (state another process publishes), at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        page.wait_for_timeout(250)
        page.reload()


def _charts_drawn(page: Any) -> int:
    return int(
        page.evaluate(
            "() => [...document.querySelectorAll('canvas[data-chart]')].filter((c) => Chart.getChart(c)).length"
        )
    )


def test_tenant_uploads_watches_it_become_ready_runs_the_playground_and_sees_usage(
    browser: Any, served: Served, adapter_dirs: dict[str, Path], shots: Path
) -> None:
    tab = Tab(browser, served.url)
    tab.sign_in(served.tenant_a[1])
    page = tab.page
    assert page.url.endswith("/console/adapters")
    page.fill("input[name=name]", "browser-writer")
    _drop_folder(page, next(iter(adapter_dirs.values())))
    assert "adapter_model.safetensors" in page.inner_text("#upload-chosen")
    tab.shot(shots, "tenant-adapters-upload")
    page.click("#upload-form button[type=submit]")
    page.wait_for_url("**/console/adapters/browser-writer")
    page.wait_for_selector("#versions .badge-ready")  # htmx polls the versions while they validate
    assert page.inner_text("#latest-ready") in ("1", "none yet")
    tab.shot(shots, "tenant-adapter")

    page.goto("/console/playground?adapter=browser-writer")
    page.fill("textarea[name=prompt]", "Say hello.")
    page.fill("input[name=max_tokens]", "8")
    page.click("#playground-form button[type=submit]")
    page.wait_for_selector("#adapter-output[data-done]")
    page.wait_for_selector("#base-output[data-done]")
    assert "8 tokens" in page.inner_text("#adapter-stats") and "8 tokens" in page.inner_text("#base-stats")
    tab.shot(shots, "tenant-playground")

    page.goto("/console/adapters/browser-writer")
    _reload_until(page, lambda: "device" in page.inner_text("#versions"))  # the worker's next heartbeat
    assert "device" in page.inner_text("#versions")
    tab.shot(shots, "tenant-adapter-resident")

    page.goto("/console/usage")
    rows = page.inner_text("#usage-table")
    assert "browser-writer" in rows and "lorahost-base" in rows
    page.wait_for_function("() => typeof Chart !== 'undefined'")
    assert _charts_drawn(page) == 4
    tab.shot(shots, "tenant-usage")
    with page.expect_download() as download_info:
        page.click("#usage-csv")
    usage = list(csv.DictReader(io.StringIO(Path(download_info.value.path()).read_text())))
    assert {r["model"] for r in usage} >= {"browser-writer", "lorahost-base"}
    page.goto("/console/keys")
    tab.shot(shots, "tenant-keys")
    page.goto("/console/adapters")
    tab.shot(shots, "tenant-adapters")
    assert tab.violations == []
    tab.close()


def test_operator_sees_the_bill_and_downloads_the_csv(browser: Any, served: Served, shots: Path) -> None:
    httpx.post(
        f"{served.url}/v1/completions",
        headers={"Authorization": f"Bearer {served.tenant_a[1]}"},
        json={"model": "lorahost-base", "prompt": "bill me", "max_tokens": 2},
        timeout=120,
    )
    name = served.tenant_name(served.tenant_a[0])
    tab = Tab(browser, served.url)
    tab.sign_in(ADMIN_KEY)
    page = tab.page
    assert page.url.endswith("/console/admin/tenants") and name in page.inner_text("#tenants")
    tab.shot(shots, "operator-tenants")
    page.goto("/console/admin/billing")
    assert name in page.inner_text("#invoices")
    tab.shot(shots, "operator-billing")
    with page.expect_download() as download_info:
        page.click("#billing-csv")
    rows = list(csv.DictReader(io.StringIO(Path(download_info.value.path()).read_text())))
    line = next(r for r in rows if r["tenant_name"] == name)
    assert int(line["num_requests"]) >= 1 and int(line["completion_tokens"]) >= 2
    for path, shot in (("/console/admin/slo?bucket=hour", "operator-slo"),
                       ("/console/admin/workers", "operator-workers"),
                       ("/console/admin/placement", "operator-placement"),
                       ("/console/admin/predictor", "operator-predictor"),
                       ("/console/admin/planner", "operator-planner")):  # fmt: skip
        page.goto(path)
        assert page.locator("h1").count() == 1
        tab.shot(shots, shot)
    page.goto("/console/admin/workers")
    assert "lorahost-base" in page.inner_text("#workers")
    page.goto("/console/admin/planner")
    page.fill("input[name=slo]", "fast please")
    page.click("#planner-form button[type=submit]")
    assert "slo" in page.inner_text("#plan-result .error").lower()  # a 400 is shown where the plan would be
    assert tab.violations == []
    tab.close()


def test_another_tenant_opens_nothing_and_a_post_without_csrf_is_refused(
    browser: Any, served: Served, adapter_dirs: dict[str, Path]
) -> None:
    adapter_dir = next(iter(adapter_dirs.values()))
    files = [
        ("files", (n, (adapter_dir / n).read_bytes()))
        for n in ("adapter_config.json", "adapter_model.safetensors")
    ]
    uploaded = httpx.post(
        f"{served.url}/v1/adapters",
        headers={"Authorization": f"Bearer {served.tenant_a[1]}"},
        data={"name": "a-private"},
        files=files,
        timeout=60,
    )
    assert uploaded.status_code == 202, uploaded.text
    tab = Tab(browser, served.url)
    tab.sign_in(served.tenant_b[1])
    page = tab.page
    assert "a-private" not in page.inner_text("main")
    assert page.goto("/console/adapters/a-private").status == 404
    assert page.goto("/console/admin/billing").status == 403
    refused = tab.context.request.post(f"{served.url}/console/keys")  # the session cookie, no token
    assert refused.status == 403
    cross = tab.context.request.post(
        f"{served.url}/console/playground/chat",
        data={"model": "a-private", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-CSRF-Token": "guessed"},
    )
    assert cross.status == 403
    # sign-out ends the session on the server: a copy of the cookie taken before it no longer opens a page
    copied = tab.context.cookies()
    page.goto("/console/adapters")
    page.click("form.signout button[type=submit]")
    page.wait_for_load_state()
    assert "/console/login" in page.url
    thief = Tab(browser, served.url)
    thief.context.add_cookies(copied)
    thief.page.goto("/console/adapters")
    assert "/console/login" in thief.page.url
    thief.close()
    tab.close()
