"""The rank-aware router (CaraServe): send a request where it adds the least per-token cost to everyone there.

Eligible workers: the ready workers of the request's base model, restricted to the placement's
`assigned_workers` that are among them; when none of the assigned workers is live (or no placement is
published) every ready worker of the base model is eligible, with weight 1.

Per eligible worker w, with its performance model M (`w.perf_model`, else `DEFAULT_PERF_MODEL`: see
scheduler/routing/perf_model.py) and `exists` = its running + queued requests (their ranks, 0 = base model):

    dPrefill = M.prefill(queue + req) - M.prefill(queue)       queue: the queued requests' prompt tokens,
                                                               split evenly among them (only the total is
                                                               published), with their ranks
    dDecode  = M.decode(exists + req) - M.decode(exists)
    cost     = dPrefill / resp_len + dDecode                   resp_len: the predicted output length (default 128)
             + SLO_PENALTY_FACTOR * (M.decode(exists + req) - slo)    when M.decode(exists + req) > slo
    total    = cost * (len(running) + len(queue))              CaraServe's score, milliseconds
             + residency_ms / resp_len                         the cold adapter's load, spread like a prefill:
                                                               0 on the device (or the base model),
                                                               M.load(rank) in host memory,
                                                               M.load(rank) + cold_fetch_ms held nowhere
    score    = total / max(weight / max_weight, MIN_RELATIVE_WEIGHT)   placement weight: the most-weighted
                                                               eligible worker keeps its total, others pay
                                                               in proportion to how much less weight they have

slo: `RouterOptions.slo_tpot_ms`, else 1.5 x M.decode([rank]) (CaraServe: 1.5x the single-adapter time per
token). Workers that publish no running/waiting ranks count their requests as rank 0.

Fair share does not enter the score: `total` multiplies the added cost by every request there (the queued
ones of every tenant are slowed by the new one as much under fair share as without it), and the request's own
wait in the queue is no term of CaraServe's score. The tenant-aware load (`scheduler.routing.router.tenant_load`) is
the default router's.

The empty-worker rule: a worker with no running or queued request has total = residency_ms / resp_len, so an
empty worker holding the adapter on its device scores 0 and wins, as in CaraServe (it adds no cost to anyone).
Equal scores (e.g. several empty workers) are broken by: adapter residency (device, then host, then none),
then the higher placement weight, then the lower worker id. Deterministic: no randomness, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.routing.perf_model import DEFAULT_PERF_MODEL, PerfModel
from scheduler.routing.router import (
    RouteRequest,
    RouterOptions,
    WorkerView,
    eligible_workers,
    residency_tier,
)

DEFAULT_RESPONSE_TOKENS = 128  # when the request carries no predicted output length
SLO_FACTOR = 1.5  # default SLO: this x the worker's single-request decode step at the request's rank
SLO_PENALTY_FACTOR = 10.0  # ms of cost per ms the batch's decode step would exceed the SLO
MIN_RELATIVE_WEIGHT = 0.05  # a worker with a tiny placement weight is penalised at most 20x


@dataclass(frozen=True)
class WorkerScore:
    """One eligible worker's score and its parts (for tests, logs and benchmarks)."""

    worker_id: str
    score: float
    total: float
    cost_per_token_ms: float
    residency_ms: float
    tier: int
    relative_weight: float

    def key(self) -> tuple[float, int, float, str]:
        """The sort key: score, then residency tier, then higher weight, then worker id."""
        return (self.score, self.tier, -self.relative_weight, self.worker_id)


@dataclass(frozen=True)
class RankAwareRouter:
    """CaraServe's rank-aware cost among the adapter's assigned workers (module doc)."""

    slo_tpot_ms: float | None = None
    cold_fetch_ms: float = 50.0

    @classmethod
    def from_options(cls, options: RouterOptions) -> RankAwareRouter:
        """The router configured from settings (RouterOptions)."""
        return cls(slo_tpot_ms=options.slo_tpot_ms, cold_fetch_ms=options.cold_fetch_ms)

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        """The eligible worker with the lowest score, or None when no ready worker serves the base model."""
        scores = self.scores(request, workers)
        return min(scores, key=WorkerScore.key).worker_id if scores else None

    def scores(self, request: RouteRequest, workers: Sequence[WorkerView]) -> list[WorkerScore]:
        """The score of every eligible worker (empty when none is ready)."""
        eligible = eligible_workers(request, workers)
        if not eligible:
            return []
        max_weight = max(weight for _, weight in eligible)
        return [
            self.score(request, w, weight / max_weight if max_weight > 0 else 1.0) for w, weight in eligible
        ]

    def score(self, request: RouteRequest, worker: WorkerView, relative_weight: float = 1.0) -> WorkerScore:
        """One worker's score for the request (module doc)."""
        model = worker.perf_model or DEFAULT_PERF_MODEL
        response_tokens = request.predicted_output_tokens or DEFAULT_RESPONSE_TOKENS
        cost = self.cost_per_token_ms(request, worker, model, response_tokens)
        tier = residency_tier(request, worker)
        residency_ms = self.residency_ms(request, model, tier)
        total = cost * (worker.num_running + worker.num_waiting) + residency_ms / response_tokens
        return WorkerScore(
            worker_id=worker.worker_id,
            score=total / max(relative_weight, MIN_RELATIVE_WEIGHT),
            total=total,
            cost_per_token_ms=cost,
            residency_ms=residency_ms,
            tier=tier,
            relative_weight=relative_weight,
        )

    def cost_per_token_ms(
        self, request: RouteRequest, worker: WorkerView, model: PerfModel, response_tokens: int
    ) -> float:
        """dPrefill / resp_len + dDecode (+ the SLO penalty): what the request adds per output token."""
        rank = request.adapter_rank
        running = _ranks(worker.running_ranks, worker.num_running)
        waiting = _ranks(worker.waiting_ranks, worker.num_waiting)
        queue = _queue_shapes(waiting, worker.num_waiting_prompt_tokens)
        new_prefill = model.prefill_ms([*queue, (request.num_prompt_tokens, rank)]) - model.prefill_ms(queue)
        exists = running + waiting
        decode_after = model.decode_ms([*exists, rank])
        cost = new_prefill / response_tokens + decode_after - model.decode_ms(exists)
        slo = self.slo_tpot_ms if self.slo_tpot_ms is not None else SLO_FACTOR * model.decode_ms([rank])
        if decode_after > slo:
            cost += SLO_PENALTY_FACTOR * (decode_after - slo)
        return cost

    def residency_ms(self, request: RouteRequest, model: PerfModel, tier: int) -> float:
        """The adapter's expected load before the request can run here (0 on the device)."""
        if tier == 0:
            return 0.0
        load = model.load_ms(request.adapter_rank)
        return load if tier == 1 else load + self.cold_fetch_ms


def _ranks(published: Sequence[int], count: int) -> list[int]:
    """The published ranks, padded with 0 (base model) up to `count` requests (workers that publish none)."""
    ranks = [max(0, int(r)) for r in published[:count]]
    return ranks + [0] * (count - len(ranks))


def _queue_shapes(waiting_ranks: Sequence[int], num_prompt_tokens: int) -> list[tuple[int, int]]:
    """The queued requests as (prompt tokens, rank), the total split evenly (only the total is published)."""
    if not waiting_ranks:
        return []
    share, extra = divmod(max(0, num_prompt_tokens), len(waiting_ranks))
    return [(share + (1 if i < extra else 0), rank) for i, rank in enumerate(waiting_ranks)]
