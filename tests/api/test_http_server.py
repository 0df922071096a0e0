"""How API processes are served (issue 33 item 7): forwarded headers count only from the proxies in
settings.api.forwarded_allow_ips (none by default), never from uvicorn's default 127.0.0.1, so a client cannot
pick its address for the console's per-address sign-in limit with X-Forwarded-For."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from api.http_server import api_server_config
from settings import Settings
from tests.api.console.console_support import LOGIN_CSRF_RE

REPO = Path(__file__).resolve().parents[2]


async def _echo_client(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app answering with the client address and scheme it was given."""
    body = f"{scope['client'][0]} {scope['scheme']}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _seen_by(settings: Settings, peer: str, headers: dict[str, str]) -> str:
    """What an app served with `settings` sees of a request from `peer` carrying `headers`."""
    config = api_server_config(_echo_client, settings)
    config.load()

    async def get() -> str:
        transport = httpx.ASGITransport(app=config.loaded_app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return (await client.get("/", headers=headers)).text

    return asyncio.run(get())


FORWARDED = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"}


def test_by_default_no_proxy_is_trusted_not_even_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn's own variable no longer applies
    assert _seen_by(Settings(), "127.0.0.1", FORWARDED) == "127.0.0.1 http"
    assert _seen_by(Settings(), "10.1.2.3", FORWARDED) == "10.1.2.3 http"


def test_a_configured_proxy_forwards_the_client_address_and_scheme() -> None:
    settings = Settings(forwarded_allow_ips="10.0.0.0/8, 127.0.0.1")
    assert _seen_by(settings, "10.1.2.3", FORWARDED) == "203.0.113.7 https"
    assert _seen_by(settings, "198.51.100.9", FORWARDED) == "198.51.100.9 http"  # not a proxy: ignored
    # a client's own X-Forwarded-For before the proxy's entry is not believed: the nearest untrusted address
    spoofed = {"X-Forwarded-For": "10.9.9.9, 192.0.2.1, 10.2.3.4"}
    assert _seen_by(settings, "10.1.2.3", spoofed).split()[0] == "192.0.2.1"


def test_a_trust_everybody_setting_is_refused_with_what_to_set() -> None:
    with pytest.raises(ValueError, match="list the proxies' addresses or networks"):
        Settings(forwarded_allow_ips="*")


def test_every_entry_point_serves_the_api_through_api_http_server() -> None:
    """`lorahost serve` / `lorahost api` (and the dev cluster and Helm chart, which run `lorahost api`) never call
    uvicorn with its defaults."""
    calls = {
        str(path.relative_to(REPO)): re.findall(r"uvicorn\.(?:run|Config)\(", path.read_text())
        for path in (REPO / "lorahost").glob("*.py")
    }
    assert {path: found for path, found in calls.items() if found} == {}
    assert "serve_api(" in (REPO / "lorahost" / "server_cli.py").read_text()


def test_the_console_limits_sign_ins_per_forwarded_client_not_per_header(
    make_client: Callable[..., TestClient],
) -> None:
    """Behind the default settings, varying X-Forwarded-For does not buy more sign-in attempts."""
    client = make_client(console_max_sign_ins_per_min=2)
    config = api_server_config(client.app, Settings())
    config.load()

    async def attempts() -> list[int]:
        transport = httpx.ASGITransport(app=config.loaded_app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            form = await http.get("/console/login")
            match = LOGIN_CSRF_RE.search(form.text)
            assert match is not None
            codes = []
            for i in range(4):
                response = await http.post(
                    "/console/login",
                    data={"key": "lh_wrong", "csrf_token": match.group(1)},
                    headers={"X-Forwarded-For": f"198.51.100.{i}"},
                )
                codes.append(response.status_code)
            return codes

    assert asyncio.run(attempts()) == [401, 401, 429, 429]


@pytest.mark.parametrize("is_access_logged", [False, True])
def test_requests_are_access_logged_only_when_the_setting_says_so(
    is_access_logged: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """uvicorn's access line is off by default (settings.api.is_access_logged)."""
    config = api_server_config(
        _echo_client, Settings(is_access_logged=is_access_logged)
    )  # logging set up here
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # a connection made before the server accepts waits in the backlog
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        answer = httpx.get(f"http://127.0.0.1:{sock.getsockname()[1]}/echo", timeout=30)
        assert answer.status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    # uvicorn writes the line (to stdout) when the response starts, before its body is sent
    assert ('"GET /echo HTTP/1.1" 200' in capsys.readouterr().out) is is_access_logged
