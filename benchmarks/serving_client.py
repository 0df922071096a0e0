"""The load side of serving.py: streamed OpenAI completions timed per token, the open-loop replay of a request
list, the warm-up, and the worker's internal generate call.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from serving_workload import WorkloadRequest


async def stream_completion(
    client: httpx.AsyncClient, url: str, headers: dict, body: dict, timeout_s: float
) -> dict:
    """One streamed OpenAI completion; times from just before the request is sent."""
    rec: dict[str, Any] = {"status": None, "ok": False}
    t0 = time.perf_counter()
    t_first = t_last = t_text = None
    n_chunks, usage, error, finish = 0, None, None, None
    try:
        async with client.stream("POST", url, headers=headers, json=body, timeout=timeout_s) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                error = (await r.aread()).decode(errors="replace")[:300]
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if obj.get("error"):
                        error = json.dumps(obj["error"])[:300]
                        continue
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for ch in obj.get("choices") or []:
                        # a token chunk: text, or (vLLM) a chunk per token whose text is still empty
                        # (special token / partial UTF-8); the closing chunk has text "" and finish_reason
                        if ch.get("text") or ch.get("finish_reason") is None:
                            now = time.perf_counter()
                            t_first = t_first or now
                            t_last = now
                            n_chunks += 1
                            if ch.get("text") and t_text is None:
                                t_text = now
                        finish = ch.get("finish_reason") or finish
    except (TimeoutError, httpx.HTTPError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    t_end = time.perf_counter()
    n_tok = (usage or {}).get("completion_tokens", n_chunks)
    rec.update(
        ok=error is None and rec["status"] == 200 and n_tok > 0,
        error=error,
        ttft_ms=None if t_first is None else 1000 * (t_first - t0),
        ttft_text_ms=None if t_text is None else 1000 * (t_text - t0),
        tpot_ms=(1000 * (t_last - t_first) / (n_tok - 1)) if t_first is not None and n_tok > 1 else None,
        e2e_ms=1000 * (t_end - t0),
        output_tokens=n_tok,
        prompt_tokens=(usage or {}).get("prompt_tokens"),
        num_chunks=n_chunks,
        finish_reason=finish,
        t_send=t0,
        t_end=t_end,
    )
    return rec


async def run_load(
    url: str,
    headers: dict,
    reqs: list[WorkloadRequest],
    make_body,
    timeout_s: float,
    drain_timeout_s: float,
) -> tuple[list[dict], float, float]:
    """Fire every request at its arrival time (open loop); returns (records, t0, t_done)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        t0 = time.perf_counter() + 0.2

        async def one(req: WorkloadRequest) -> dict:
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = await stream_completion(client, url, headers, make_body(req), timeout_s)
            rec["index"] = req.index
            rec["adapter"] = req.adapter
            rec["requested_output_tokens"] = req.output_tokens
            rec["workload_prompt_tokens"] = req.prompt_tokens
            rec["send_lateness_ms"] = 1000 * (rec["t_send"] - (t0 + req.arrival_s))
            return rec

        tasks = [asyncio.create_task(one(r)) for r in reqs]
        last_arrival = reqs[-1].arrival_s if reqs else 0.0
        deadline = max(0.0, t0 + last_arrival + drain_timeout_s - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=deadline)
        for t in pending:
            t.cancel()
        records = []
        for r, t in zip(reqs, tasks, strict=True):
            if t in done and not t.cancelled() and t.exception() is None:
                records.append(t.result())
            else:
                err = "cut: still running at the drain deadline" if t in pending else repr(t.exception())
                records.append(
                    {
                        "index": r.index,
                        "adapter": r.adapter,
                        "ok": False,
                        "status": None,
                        "error": err,
                        "requested_output_tokens": r.output_tokens,
                    }
                )
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        t_done = max([rec.get("t_end", t0) for rec in records] + [t0])
    return records, t0, t_done


async def worker_generate(client: httpx.AsyncClient, worker_url: str, token: str, body: dict) -> dict:
    """TTFT of one internal generate call (first delta with a token), read to the end."""
    t0 = time.perf_counter()
    t_first, final, error = None, None, None
    async with client.stream(
        "POST", f"{worker_url}/internal/v1/generate", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as r:
        if r.status_code != 200:
            error = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
        else:
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("type") == "delta" and ev.get("token_ids") and t_first is None:
                    t_first = time.perf_counter()
                elif ev.get("type") == "final":
                    final = ev
                elif ev.get("type") == "error":
                    error = json.dumps(ev)[:300]
    return {
        "ttft_ms": None if t_first is None else 1000 * (t_first - t0),
        "final": final,
        "error": error,
        "e2e_ms": 1000 * (time.perf_counter() - t0),
    }


def request_body(system: str, req: WorkloadRequest, prompt_format: str) -> dict:
    body: dict[str, Any] = {
        "model": req.adapter,
        "prompt": req.prompt if prompt_format == "text" else req.prompt_token_ids,
        "max_tokens": req.output_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # vLLM's extensions, which lorahost's API takes too: exactly max_tokens outputs on every system
    body.update(ignore_eos=True, min_tokens=req.output_tokens)
    return body


async def warmup(url: str, headers: dict, system: str, reqs: list[WorkloadRequest], fmt: str) -> dict:
    """One short request per adapter used by the workload, sequentially (adapters loaded, paths compiled)."""
    seen: dict[str, WorkloadRequest] = {}
    for r in reqs:
        seen.setdefault(r.adapter, r)
    t0 = time.perf_counter()
    errors = []
    async with httpx.AsyncClient(timeout=300) as client:
        for r in seen.values():
            body = request_body(system, r, fmt) | {"max_tokens": 2, "min_tokens": 2}
            rec = await stream_completion(client, f"{url}/v1/completions", headers, body, 300)
            if not rec["ok"]:
                errors.append(f"{r.adapter}: {rec['status']} {rec['error']}")
    return {
        "warmup_s": round(time.perf_counter() - t0, 2),
        "warmup_adapters": len(seen),
        "warmup_errors": errors,
    }
