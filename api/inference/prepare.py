"""Preparing an inference request: everything between authentication and routing.

refuse a tenant whose requests_per_min this process knows spent -> parse the
body (bounded: api/request_limits.py) -> the plan's caps on n, best_of and top_logprobs (api/plan_limits.py)
-> refuse fields this server cannot honour (and best_of below n, or above n streamed:
api/inference/choices.py) -> resolve the model (`model` is an adapter name, `name@N` or the base model) ->
tokenize and size-check the prompt -> take a concurrency slot and charge the request with its tokens_per_min
(the prompt once + n, or best_of, x max_tokens) in one check. A request that fails on the way is charged to
requests_per_min alone as it fails (every request that arrives is charged once: api/request_charge.py). The
result is a `Prepared` request (its output-length prediction is filled in next, by api/inference/predict.py).
Every refusal here is an ApiError or a PromptError (400).
Its prefix-cache namespace is the tenant's own unless an operator put the tenant in a shared one
(`TenantAuth.cache_namespace`): the engine reuses cached prompt KV only within one namespace, so no tenant
can time another's prompts.

The hot path stays on the event loop (no threadpool hop, no DB query): the model comes from the model
cache, short prompts are tokenized inline and the rate limits are one check (in memory, or one round trip on
the loop's own Redis connection). Cache misses and long prompts run in the threadpool.
Sampling fields (penalties, logit_bias, logprobs and vLLM's extensions) are checked and turned into the wire
spec by api/inference/sampling_fields.py.
"""

from __future__ import annotations

import reprlib
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from fastapi import Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.caches import ResolvedModel, TenantAuth, stale_on_outage
from api.errors import DATABASE_ERRORS, ApiError
from api.inference.choices import check_best_of
from api.inference.logprobs_format import LogprobsFormatter
from api.inference.sampling_fields import check_sampling_fields, sampling_spec
from api.inference.schemas import ChatCompletionRequest, CompletionRequest, InferenceRequestBase
from api.inference.structured import request_constraint
from api.inference.tools import ToolPlan, chat_inputs, tool_plan
from api.metering import release_slot
from api.plan_limits import check_plan_limits
from api.prompting import BaseModelTokenizer, PromptError
from api.ratelimit import RateLimits
from api.request_charge import ArrivalCharge, charged_once, refuse_unless_allowed
from api.request_limits import check_prompt_bounds, parse_json_object, prompt_chars, read_body
from api.request_meter import RequestMeter
from api.services import Services
from cluster.protocol import AdapterRef, GenerateRequest, StructuredOutputSpec
from registry import repository
from registry.base_model_catalog import resolve_base_model_name
from registry.errors import NotFoundError
from registry.model_names import could_name_a_model
from scheduler.core.structured_output import StructuredOutput
from scheduler.routing.router import RouteRequest, adapter_engine_features
from settings import Settings

Kind = Literal["text", "chat"]
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
MAX_INLINE_PROMPT_CHARS = 4096  # longer prompts are tokenized in the threadpool, off the event loop
# Fields the route knows but cannot honour, with the only value(s) it accepts for each.
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
    "functions": (None, []),  # the deprecated form of tools: send tools
    "function_call": (None, "none"),
}


@dataclass
class Prepared:
    """An admitted request, ready to send to a worker (once predict.py has set its predicted length)."""

    kind: Kind
    response_id: str
    model: str
    is_stream: bool
    include_usage: bool
    route: RouteRequest
    generate: GenerateRequest  # choice 0's; the others' are derived from it (api/inference/choices.py)
    num_choices: int = 1  # returned (n)
    num_sequences: int = 1  # generated: n, or best_of (the n best returned)
    logprobs_formatter: LogprobsFormatter | None = None  # when the request asked for logprobs
    echo_text: str | None = None  # completions' echo: the prompt's text, shown before the completion
    tools: ToolPlan | None = (
        None  # its tools: the output is parsed into tool_calls (api/inference/tool_calls.py)
    )
    # the response's `created` (Unix seconds), the same in every chunk of a stream, as OpenAI's are
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_tokens(self) -> int:
        """The effective max_tokens (the request's, or the default), after the size checks."""
        return self.generate.sampling.max_tokens


async def prepare(
    request: Request,
    tenant: TenantAuth,
    services: Services,
    meter: RequestMeter,
    kind: Kind,
    path_model: str | None,
) -> Prepared:
    """Validate, resolve, size-check and rate-limit a request (the meter learns the model and prompt size)."""
    limits = tenant.limits
    async with charged_once(services.rate_limiter, tenant.tenant_id, limits.max_requests_per_min) as charge:
        body = await parse_body(request, services.settings, kind)
        check_plan_limits(body, tenant.sampling_limits)
        refuse_unsupported(body)
        check_best_of(body)
        model = model_ref(body.model, path_model)
        meter.model_name = repository.parse_model_ref(model).name
        resolved = await resolve(services, tenant.tenant_id, model)
        meter.adapter_id, meter.adapter_version_id = resolved.adapter_id, resolved.adapter_version_id
        meter.base_model_name = resolved.base_model
        check_prompt_bounds(body, services.settings)
        tokenizer = await base_tokenizer(services, resolved.base_model)
        tools = tool_plan(body.tools, body.tool_choice) if isinstance(body, ChatCompletionRequest) else None
        if prompt_chars(body) <= MAX_INLINE_PROMPT_CHARS:
            prompt_ids = prompt_token_ids(tokenizer, body, tools)
        else:
            prompt_ids = await run_in_threadpool(prompt_token_ids, tokenizer, body, tools)
        meter.num_prompt_tokens = len(prompt_ids)
        max_tokens = check_sizes(services.settings, tokenizer, body, len(prompt_ids))
        check_sampling_fields(body, tokenizer, max_tokens)
        meter.num_choices = body.num_sequences  # generated side by side, each billed (best_of: all of them)
        # the prompt once, each sequence's output
        num_tokens = len(prompt_ids) + body.num_sequences * max_tokens
        structured = request_constraint(body, tools)
        if structured is not None:  # compiled against the base model's tokenizer: a bad one is a 400 here
            await run_in_threadpool(services.structured.check, tokenizer, structured)
        await admit(services, charge, num_tokens, limits, meter)
    prepared = _prepared(body, kind, model, resolved, prompt_ids, max_tokens, tenant, meter, structured)
    prepared.tools = tools
    if prepared.generate.sampling.logprobs is not None:
        prepared.logprobs_formatter = LogprobsFormatter(kind, tokenizer)
    if isinstance(body, CompletionRequest) and body.echo:
        prepared.echo_text = echo_text(body, tokenizer, prompt_ids)
    prepared.route = with_placement(prepared.route, services.routing_table.row(prepared.route.adapter_key))
    return prepared


def _prepared(
    body: InferenceRequestBase,
    kind: Kind,
    model: str,
    resolved: ResolvedModel,
    prompt_ids: list[int],
    max_tokens: int,
    tenant: TenantAuth,
    meter: RequestMeter,
    structured: StructuredOutput | None = None,
) -> Prepared:
    response_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{meter.request_id.removeprefix('req-')}"
    sampling = sampling_spec(body, max_tokens)
    if structured is not None:
        spec = StructuredOutputSpec(kind=structured.kind, spec=structured.spec)
        sampling = sampling.model_copy(update={"structured_output": spec})
    adapter_key = resolved.adapter.adapter_key if resolved.adapter else None
    return Prepared(
        kind=kind,
        response_id=response_id,
        model=model,
        is_stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        num_choices=body.num_choices,
        num_sequences=body.num_sequences,
        route=RouteRequest(
            resolved.base_model,
            adapter_key,
            len(prompt_ids),
            adapter_rank=resolved.adapter.rank if resolved.adapter else 0,
            engine_features=frozenset(resolved.adapter.engine_features if resolved.adapter else ()),
            tenant_id=tenant.tenant_id,
        ),
        generate=GenerateRequest(
            request_id=meter.request_id,
            prompt_token_ids=prompt_ids,
            adapter=resolved.adapter,
            sampling=sampling,
            tenant_id=tenant.tenant_id,
            tenant_weight=tenant.fair_share_weight,
            cache_namespace=tenant.cache_namespace,  # the operator's choice, never the request's
        ),
    )


def with_placement(route: RouteRequest, row: tuple[tuple[str, float], ...]) -> RouteRequest:
    """The route with the adapter's rank-aware inputs: its routing-table row (from the API's in-memory copy of
    the published placement; () when none) as `assigned_workers`."""
    return replace(route, assigned_workers=row) if row else route


async def parse_body(request: Request, settings: Settings, kind: Kind) -> InferenceRequestBase:
    """The validated body, read within settings.limits.max_request_body_bytes (see api/request_limits.py)."""
    raw = await parse_json_object(await read_body(request, settings.limits.max_request_body_bytes))
    schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()]
        raise ApiError(400, "invalid_request", "; ".join(parts)) from exc


def refuse_unsupported(body: InferenceRequestBase) -> None:
    """400 naming every field this server cannot honour (unknown fields included)."""
    # reprlib: a short repr however large or deep the value (the message quotes the tenant's input)
    problems = [f"{name}={reprlib.repr(value)}" for name, value in (body.model_extra or {}).items()]
    for name, allowed in NO_OP_VALUES.items():
        value = getattr(body, name, None)
        if value not in allowed:
            problems.append(f"{name}={reprlib.repr(value)}")
    if problems:
        raise ApiError(
            400,
            "invalid_request",
            f"unsupported field(s): {', '.join(problems)}; remove them "
            "(docs/sampling.md lists the fields this server supports)",
        )
    if len(body.stop_list()) > MAX_STOP_STRINGS or any(not s for s in body.stop_list()):
        raise ApiError(
            400, "invalid_request", f"stop must be a non-empty string or up to {MAX_STOP_STRINGS} of them"
        )


def model_ref(body_model: str | None, path_model: str | None) -> str:
    """The model the request names: the body's `model`, or the adapter in the path (they must agree)."""
    if path_model is None:
        if not body_model:
            raise ApiError(
                400, "invalid_request", "model is required: an adapter name, name@N or the base model"
            )
        return body_model
    if body_model and repository.parse_model_ref(body_model).name != path_model:
        raise ApiError(
            400,
            "invalid_request",
            f"model {body_model!r} does not match the adapter {path_model!r} "
            "in the path; omit model or use name@N of the same adapter",
        )
    return body_model or path_model


async def resolve(services: Services, tenant_id: str, model: str) -> ResolvedModel:
    """The adapter version to apply and the base model to route to (the model cache, read through: the DB in a
    thread)."""
    base_name = services.settings.base_model_name
    if model == base_name:
        return ResolvedModel(base_model=base_name)
    cache = services.model_cache
    try:  # read through (reloaded in the background before it expires: api/caches.py)
        resolved = await cache.load(
            (tenant_id, model), partial(run_in_threadpool, _resolve_in_db, services, tenant_id, model)
        )
    except DATABASE_ERRORS as exc:
        return stale_on_outage(cache, (tenant_id, model), exc)
    assert resolved is not None  # _resolve_in_db raises for what it cannot resolve
    return resolved


def _resolve_in_db(services: Services, tenant_id: str, model: str) -> ResolvedModel:
    name = repository.parse_model_ref(model).name
    if not could_name_a_model(name):  # no adapter or model has it: nothing to ask the database
        raise NotFoundError(
            f"no model {name[:80]!r}: use an adapter name, name@N or a base model", code="model_not_found"
        )
    with services.session_factory() as session:
        base = resolve_base_model_name(session, model)
        if (
            base is not None
        ):  # a base model's name or alias never reaches an adapter (registry/model_names.py)
            return ResolvedModel(base_model=base)
        adapter, version = repository.resolve_model(session, tenant_id, model)
        ref = AdapterRef(
            adapter_key=version.id,
            sha256=version.sha256 or "",
            config_sha256=version.config_sha256,  # None for pre-0002 rows: workers key those by version id
            config_blob_key=version.config_blob_key or "",
            weights_blob_key=version.weights_blob_key or "",
            rank=version.rank or 0,
            engine_features=sorted(adapter_engine_features(version.use_dora, version.target_modules or ())),
            owner_id=adapter.tenant_id,  # workers never share cached files between two owners
        )
        return ResolvedModel(adapter.base_model_name, ref, adapter.id, version.id)


async def base_tokenizer(services: Services, base_model: str) -> BaseModelTokenizer:
    """The tokenizer of the base model a request runs on: the configured model's, else the catalog's (fetched
    and loaded on first use, api/base_tokenizers.py); 503 when this API server has none for it."""
    if base_model == services.settings.base_model_name and services.tokenizer is not None:
        return services.tokenizer
    tokenizer = await run_in_threadpool(services.catalog_tokenizers.get, base_model)
    if tokenizer is None:
        raise ApiError(
            503,
            "unavailable",
            f"no tokenizer for base model {base_model!r} on this API server (a catalog model needs its "
            "tokenizer.json: `lorahost models add`; the configured one LORAHOST_BASE_MODEL_PATH)",
        )
    return tokenizer


def echo_text(body: CompletionRequest, tokenizer: BaseModelTokenizer, prompt_ids: list[int]) -> str:
    """The prompt as `echo` shows it: the text sent, or a token prompt's decoded text."""
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids)


def prompt_token_ids(
    tokenizer: BaseModelTokenizer, body: InferenceRequestBase, tools: ToolPlan | None = None
) -> list[int]:
    """The prompt's token ids (a chat is rendered with the model's template first, with its tools)."""
    if isinstance(body, ChatCompletionRequest):
        return tokenizer.encode_chat(*chat_inputs(tokenizer, body.messages, tools))[1]
    assert isinstance(body, CompletionRequest)
    prompt = body.prompt
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if not prompt:
        raise PromptError("the prompt is empty")
    if all(isinstance(p, int) for p in prompt):
        return tokenizer.check_token_ids(prompt)
    only = prompt[0]
    if len(prompt) == 1 and isinstance(only, str):
        return tokenizer.encode(only)
    if len(prompt) == 1 and isinstance(only, list):
        return tokenizer.check_token_ids(only)
    raise PromptError(
        "prompt must be a string, a list of one string, or one list of token ids (batches of "
        f"prompts are not supported: got {len(prompt)}); send one request per prompt"
    )


def check_sizes(
    settings: Settings, tokenizer: BaseModelTokenizer, body: InferenceRequestBase, num_prompt: int
) -> int:
    """The effective max_tokens, after refusing prompts and completions beyond the limits."""
    context = tokenizer.max_context_tokens
    if num_prompt == 0:
        raise PromptError("the prompt is empty")
    if num_prompt > settings.limits.max_prompt_tokens:
        raise PromptError(
            f"the prompt has {num_prompt} tokens; the limit is {settings.limits.max_prompt_tokens} tokens"
        )
    requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if requested is not None and requested > settings.limits.max_completion_tokens:
        raise PromptError(
            f"max_tokens={requested} is above the limit of {settings.limits.max_completion_tokens}"
        )
    if requested is None:
        default = (
            DEFAULT_COMPLETION_MAX_TOKENS
            if isinstance(body, CompletionRequest)
            else settings.limits.max_completion_tokens
        )
        requested = min(default, (context or num_prompt + default) - num_prompt)
    if context is not None and num_prompt + requested > context:
        raise PromptError(
            f"prompt ({num_prompt} tokens) + max_tokens ({requested}) exceeds the model's context of "
            f"{context} tokens; shorten the prompt or lower max_tokens"
        )
    return requested


async def admit(
    services: Services,
    charge: ArrivalCharge,
    num_tokens: int,
    limits: RateLimits,
    meter: RequestMeter | None = None,
) -> None:
    """Take one of the tenant's concurrent-request slots (when its plan caps them; the meter releases it when
    the request is recorded), then charge the request to requests_per_min with `num_tokens` to tokens_per_min in
    one check (`charge` records that it is charged); 429 with Retry-After naming the limit when over one
    (nothing is then held, and the request alone is charged unless the requests budget itself refused it)."""
    limiter, tenant_id = services.rate_limiter, charge.tenant_id
    cap = limits.max_concurrent_requests
    if cap is not None and meter is not None:
        refuse_unless_allowed(await limiter.acquire_slot_async(tenant_id, meter.request_id, cap))
        meter.release_slot = partial(limiter.release_slot_async, tenant_id, meter.request_id)
    if limits.max_requests_per_min is None and limits.max_tokens_per_min is None:
        return
    budgets = RateLimits(limits.max_requests_per_min, limits.max_tokens_per_min)
    decision = await limiter.admit_async(tenant_id, num_tokens, budgets)
    charge.is_charged = True  # with its tokens, or alone (tokens refused), or refused by the budget itself
    if not decision.is_allowed and meter is not None:
        await release_slot(meter)
    refuse_unless_allowed(decision)
