"""The internal API between API servers and workers (shapes only; no I/O).

Every call carries `Authorization: Bearer <internal_token>` (compared in constant time by the worker).
Tenants never reach this API.

  POST {worker}/internal/v1/generate      body GenerateRequest -> NDJSON stream of GenerateEvent lines
  POST {worker}/internal/v1/adapters/prefetch   body AdapterRef -> {"adapter_key", "residency"}
  POST {worker}/internal/v1/adapters/drop       body {"adapter_key"} -> {"dropped": bool}
  GET  {worker}/internal/v1/stats         -> WorkerStats
  GET  {worker}/internal/v1/health        -> 200 while the process lives
  GET  {worker}/internal/v1/ready         -> 200 when the model is loaded and not draining, else 503

A generate stream is: zero or more `delta` events, then exactly one terminal event, `final` or `error`.
Closing the HTTP stream early aborts the engine request (its blocks are freed).
NDJSON lines omit fields at their default values; parse each with `GenerateEvent.model_validate_json`.

Errors: everything detectable before generation starts is an HTTP error with the JSON body
`{"error": {"type": <code>, "message": <what to change>}}` and no stream. Each code has one HTTP status,
`WORKER_ERROR_STATUS` below: the worker answers with it, and the API answers a tenant with the same status
for the codes in `TENANT_VISIBLE_CODES` (the others are the deployment's failures: the API answers 502):
  400 bad_request (invalid body or sampling, empty prompt or both/neither of prompt and prompt_token_ids,
      prompt >= max_model_len, duplicate request_id)
  401 unauthorized (missing or wrong internal token; a tenant sees 502: the deployment is misconfigured)
  424 adapter_unavailable (the adapter's blobs are missing, fail the sha256 check or do not load). Not the
      tenant's request's fault, but not worth a blind retry either: the same files fail the same way on
      every worker until the version is re-uploaded or the operator repairs the blob store, so it is
      neither a 400 (the request is valid) nor a 503 with Retry-After (OpenAI clients retry those). 424
      Failed Dependency says the request depended on something that failed; clients do not auto-retry it.
  503 draining (worker shutting down: route elsewhere), 503 overloaded (model still loading): both
      retried on another worker, then held as a cold start. Adapter room is never a refusal: a request
      whose adapter does not fit the worker's page pool right now waits in the engine's queue
  500 internal (an engine failure; a tenant sees 502)
Once the 200 stream has started, failures arrive as one terminal `error` event (code internal for an
engine failure; bad_request for a request whose logits went non-finite (its adapter's weights overflow);
adapter_unavailable when the engine's copy of the adapter to the device failed, i.e. its verified host
files vanished or changed after registration).
The adapter's files are fetched, verified and registered with the engine (validated, host only) before the
response starts, so a cold adapter's download delays the headers; its copy to the device happens in the
engine before the request's first step (it counts in ttft_ms, not queue_ms).

Timings in `final` (milliseconds, from the worker's receipt of the request): queue_ms = until the engine
queued the request (adapter fetch + registration), ttft_ms = until the first token, tpot_ms = mean time per output
token after the first (None with fewer than 2 tokens), e2e_ms = until the last token.
Prefetch fetches, registers and puts the adapter on the device when the page pool has room now; it returns
residency "device", or "host" when the adapters that would have to go are in use (a hint, never a refusal).
/ready is 503 while loading or draining.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.scheduler_stats import SchedulerStats
from scheduler.core.structured_output import StructuredKind

INTERNAL_PREFIX = "/internal/v1"

# One HTTP status per worker error code, used by the worker to answer and by the API to answer the tenant.
WORKER_ERROR_STATUS: dict[str, int] = {
    "bad_request": 400,
    "unauthorized": 401,
    "adapter_unavailable": 424,
    "internal": 500,
    "overloaded": 503,
    "draining": 503,
}
# Codes about the request or worker capacity, passed on to the tenant with their status; any other code (or
# an unknown one) is the worker's or the deployment's failure, which the API answers with 502 Bad Gateway.
TENANT_VISIBLE_CODES = frozenset({"bad_request", "adapter_unavailable", "overloaded", "draining"})
UPSTREAM_FAILURE_STATUS = 502


def tenant_status(code: str | None) -> int:
    """The HTTP status the API answers a tenant with when a worker refuses with `code` before any token."""
    if code in TENANT_VISIBLE_CODES:
        return WORKER_ERROR_STATUS[code]
    return UPSTREAM_FAILURE_STATUS


class AdapterRef(BaseModel):
    """Where a worker finds an adapter version's files. `adapter_key` is unique per version.

    The worker verifies both files against their digests and caches them under a key derived from both and
    from `owner_id` (versions with identical weights and different configs never share an entry, nor do two
    tenants' identical files); a version without `config_sha256` (validated before it was recorded) is cached
    under its `adapter_key` alone.
    """

    adapter_key: str = Field(description="Stable key of one adapter version (its version id)")
    sha256: str = Field(description="sha256 of adapter_model.safetensors")
    config_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of adapter_config.json (None for versions validated before it was recorded)",
    )
    config_blob_key: str
    weights_blob_key: str
    rank: int = 0
    engine_features: list[str] = Field(
        default_factory=list,
        description="What the adapter needs of an engine beyond plain LoRA ('dora', 'vocab_lora': LoRA on "
        "embed_tokens / lm_head); only engines serving them all take it (scheduler/routing/router.py)",
    )
    owner_id: str | None = Field(
        default=None,
        description="The tenant owning the adapter: a worker shares cached files only between versions of one "
        "owner (None: shared by content alone)",
    )


class StructuredOutputSpec(BaseModel):
    """What the output must match (scheduler/core/structured_output.py): kind and its spec text."""

    kind: StructuredKind
    spec: str = ""


class SamplingSpec(BaseModel):
    """Sampling parameters forwarded to the engine."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = Field(default_factory=dict)
    # None: no logprobs; k >= 0: each token's logprob and its top k alternatives (scheduler/core/sampling.py)
    logprobs: int | None = None
    # report the sum of the sampled tokens' logprobs on `final` (GenerateEvent.cumulative_logprob), logprobs
    # or not: the API ranks best_of sequences by it
    needs_cumulative_logprob: bool = False
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (completions' echo)
    structured_output: StructuredOutputSpec | None = None


class TokenLogprobs(BaseModel):
    """A generated token's log probability and its top alternatives [(token id, logprob)], best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = Field(default_factory=list)


class GenerateRequest(BaseModel):
    """One inference request, already authorised, templated and size-checked by the API."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    adapter: AdapterRef | None = None
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    predicted_output_tokens: int | None = None
    tenant_id: str | None = None
    # The tenant's fair-share weight (its plan's; scheduler/admission/fair_share.py): its share of the engine relative to 1.
    tenant_weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # Prefix-cache namespace chosen by the API (`prefix_cache_namespace`: the tenant's own, or a namespace an
    # operator shares); None: the tenant's own. Cached KV blocks are reused only within one namespace.
    cache_namespace: str | None = None


def prefix_cache_namespace(tenant_id: str | None, shared: str | None = None) -> str | None:
    """The engine's prefix-cache namespace of a request: `shared:<name>` when an operator put the tenant in a
    shared namespace, else `tenant:<id>` (None without a tenant: direct engine use). The prefixes keep the two
    kinds apart, so no shared name can equal a tenant's own namespace."""
    if shared is not None:
        return f"shared:{shared}"
    return f"tenant:{tenant_id}" if tenant_id is not None else None


class GenerateEvent(BaseModel):
    """One NDJSON line of a generate stream."""

    type: Literal["delta", "final", "error"]
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None  # one per token id, when the request asked for logprobs
    # on the first delta when the request asked for prompt logprobs: one per prompt token (None first)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # final only
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    # the sum of the generated tokens' logprobs (the distribution SamplingSpec.logprobs describes), when the
    # request set needs_cumulative_logprob; None otherwise (or from a worker that predates it)
    cumulative_logprob: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    queue_ms: float | None = None
    # error only: code is a key of WORKER_ERROR_STATUS
    code: str | None = None
    message: str | None = None


class WorkerRefusedError(Exception):
    """A worker refused a generate request before streaming (what HTTP answers with a non-200 status and
    the error body); raised by in-process transports, which have no status line."""

    def __init__(self, code: str, message: str, status_code: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status_code = status_code


class EngineSummary(ExecutorStats):
    """What a worker publishes of its engine's own measurements (`WorkerStats.engine`): the fields every
    executor has (`ExecutorStats`: the backend, its largest adapter rank, the kernel tuner's choices and cost)
    and the core's recent step timings. One fixed type, so the published JSON parses back: an executor's own
    fields (`RunnerStats`, `SimulatedExecutorStats`, `VllmStats`) stay local diagnostics
    (`cluster.worker_stats.UNPUBLISHED_ENGINE_FIELDS`)."""

    decode_step_ms: float | None = None  # median of the engine's recent decode-only steps (None: none yet)
    prefill_step_ms: float | None = None  # median of its recent steps with prefill tokens


class WorkerStats(BaseModel):
    """A worker's state: what /stats answers and what every heartbeat carries.

    The one typed model of worker state, composed of three parts: the worker process's own fields (below),
    `scheduler`, the engine core's `SchedulerStats` (queues, pages, residency, the router's inputs;
    scheduler/core/scheduler_stats.py), and `engine`, the engine's published measurements (`EngineSummary`).
    Two fields merge the worker's and the engine's counts, each where a reader looks for it:
    `num_load_failures` (the worker's fetch, verification and registration failures plus the engine's failed
    copies to the device) and `scheduler.adapter_ranks` (the engine's registered adapters plus the adapters
    whose files only the worker's host cache holds: every adapter the router may find resident here).
    The worker and the twin build it from the engine's typed `EngineStats` with the one conversion
    `cluster.worker_stats.build_worker_stats`; the heartbeat record is this plus the worker's URL
    (`cluster.membership.WorkerRecord`), and the router's view is read from it by
    `cluster.worker_view.worker_view`. Unknown fields are refused at every level (extra="forbid"): nothing is
    dropped silently (`WorkerRecord.from_json` drops a newer worker's fields explicitly).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker_id: str
    base_model: str
    max_num_seqs: int = 1
    host_adapters: tuple[
        str, ...
    ] = ()  # adapters whose verified files are in the host cache, not on the device
    num_active: int = 0  # generate requests in flight at the worker (fetching/loading their adapter included)
    num_cache_hits: int = 0  # requests whose adapter was on the device (or being copied) at admission
    num_cache_misses: int = 0  # requests whose adapter was not (it is copied before their first step)
    num_adapter_unloads: int = 0
    # the worker's fetch, verification and registration failures + the engine's failed copies to the device
    num_load_failures: int = 0
    # the worker's profile (scheduler.routing.perf_model.PerfModel.to_dict)
    perf_model: dict[str, Any] | None = None
    is_ready: bool = True
    is_draining: bool = False
    # the engine core's state (its adapter_ranks also holds the host cache's adapters: class doc)
    scheduler: SchedulerStats = Field(default_factory=SchedulerStats)
    # the engine's backend, rank limit, kernels and step timings
    engine: EngineSummary = Field(default_factory=EngineSummary)
