"""A large JSON answer encoded off the event loop: a report of thousands of rows through FastAPI's
jsonable_encoder (which walks every value) and JSONResponse (which encodes on the event loop) cost ~5x what one
json.dumps does, and blocked every other request of the process meanwhile."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool


def json_bytes(payload: Any) -> bytes:
    """`payload` (JSON types only: str, int, float, bool, None, lists and dicts of them) as compact UTF-8 JSON,
    encoded as Starlette's JSONResponse does."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


async def json_response_in_thread(build: Callable[[], Any]) -> Response:
    """Build the payload and encode it in a worker thread; an application/json response."""
    body = await run_in_threadpool(lambda: json_bytes(build()))
    return Response(body, media_type="application/json")
