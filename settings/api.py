"""The API server's sections: the HTTP process (`api`), request and upload limits (`limits`) and how a request
picks its worker (`routing`)."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode

from settings.section import named_choice, section_config

# the default ceiling on an adapter's LoRA rank: the upload limit, and so the engine's (resolved_max_lora_rank)
DEFAULT_MAX_LORA_RANK = 256

# checked against scheduler/routing/router_policies.py ROUTER_POLICIES (docs/scheduling.md says why this one)
DEFAULT_ROUTER_POLICY = "holders_least_loaded"


class ApiSettings(BaseModel):
    """The API process: bind address, keys, caches, cold-start waits, uploads and imports (flat names as is)."""

    model_config = section_config("")

    host: str = "127.0.0.1"
    port: int = 8000
    admin_key: str | None = None
    metrics_token: str | None = Field(
        default=None,
        description="API: bearer token that opens /metrics to a Prometheus scraper (besides the admin key). "
        "By default /metrics needs `Authorization: Bearer <admin key or metrics_token>`: it names workers",
    )
    is_metrics_public: bool = Field(
        default=False,
        description="API: serve /metrics without authentication (only behind a network that keeps it private)",
    )
    is_access_logged: bool = Field(
        default=False,
        description="API: log uvicorn's access line (client address, method, path, status) for every request. Off by "
        "default: every inference request has its usage row (tenant, model, status, tokens, latencies, error) and "
        "the request metrics, and the line is formatted and written to stderr on the event loop (~3% of a request's "
        "CPU there; a log reader that stops reading stalls serving once the pipe is full)",
    )
    api_instance_id: str | None = Field(
        default=None,
        max_length=200,
        description="API: owner id of the usage rows this process opens; on start a process closes the rows its "
        "predecessor with the same id left open (crash, kill -9) as `interrupted`. Default <hostname>-<port> "
        "(`lorahost api`; give each replica a stable id, e.g. its StatefulSet pod name) or <hostname>-embedded "
        "(`lorahost serve`)",
    )
    max_worker_connections: int = Field(
        default=8192,
        ge=1,
        description="API: connections this process may hold open to workers, together; each streaming request "
        "holds one, so this bounds the process's concurrent inference requests (one more waits up to 10 s for a "
        "free connection, then is refused with 503). Keep the process's open-file limit above about twice it",
    )
    worker_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="API: a worker's generate stream that sends nothing (no event, no keepalive line: "
        "LORAHOST_STREAM_KEEPALIVE_S) for this long is given up: its request ends with a worker error. It catches "
        "links that go silent without a reset (a partition, a vanished host). Upgrade workers before API replicas "
        "(a worker that predates keepalives sends nothing while a request waits for its first token)",
    )
    cold_start_timeout_s: float = Field(
        default=120.0,
        ge=0,
        description="API: how long an inference request waits for a ready worker of its base model (cold start, "
        "model still loading, scale from zero) before it is refused with 503 + Retry-After",
    )
    cold_start_poll_interval_s: float = Field(
        default=0.1,
        gt=0,
        description="API: how often a request waiting through a cold start re-reads the workers",
    )
    auth_cache_ttl_s: float = Field(
        default=5.0,
        ge=0,
        description="API: verified keys cached per process; the revocation delay across replicas",
    )
    model_cache_ttl_s: float = Field(
        default=2.0, ge=0, description="API: resolved adapter versions cached per process (0 = off)"
    )
    cache_stale_on_db_outage_s: float = Field(
        default=300.0,
        ge=0,
        description="API: while the database cannot be reached, inference serves a cached key or adapter up to this "
        "long past its TTL (known tenants keep being served through a restart or failover; a key revoked on "
        "another replica meanwhile is refused once the database answers again; 0 = answer 503 at once)",
    )
    upload_tmp_dir: Path | None = Field(
        default=None,
        description="API: where multipart upload bodies are written before validation, one subfolder per API "
        "instance (api_instance_id), emptied when that instance starts; default data_dir/upload-tmp",
    )
    import_allowed_buckets: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="API: s3:// buckets a tenant may import adapters from WITHOUT its own credentials, read with "
        "the platform's credentials (comma-separated names; default none). The platform's own blob bucket is "
        "refused even when listed",
    )
    is_import_private_network_allowed: bool = Field(
        default=False,
        description="API: also let imports reach http:// URLs and loopback/private/link-local addresses (import "
        "URLs and tenant S3 endpoints). Tests and local development only: it opens the internal network to "
        "tenants",
    )
    import_hf_endpoint: str = Field(
        default="https://huggingface.co",
        description="API: the Hugging Face Hub (or a mirror speaking its file API) that hf://org/name imports "
        "read from; an operator's choice only, tenants cannot name another (HF_ENDPOINT is not read)",
    )
    is_import_hf_enabled: bool = Field(
        default=True, description="API: accept hf://org/name[@revision] imports (false: refused with 403)"
    )

    is_console_enabled: bool = Field(
        default=True, description="API: serve the web console at /console (api/console/)"
    )
    console_secret: str | None = Field(
        default=None,
        description="API: the secret that signs console session cookies (the same on every replica). Default: "
        "derived from the admin key; with neither, random per process (sessions end on restart)",
    )
    console_session_ttl_s: float = Field(
        default=12 * 3600.0, gt=0, description="API: how long a console sign-in lasts"
    )
    console_max_sign_ins_per_min: int = Field(
        default=10,
        gt=0,
        description="API: console sign-in attempts allowed per client address and minute (429 beyond; shared "
        "across replicas through Redis when configured)",
    )
    forwarded_allow_ips: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="API: the proxies (addresses or networks, comma-separated, e.g. 10.0.0.0/8) whose "
        "X-Forwarded-For/-Proto uvicorn trusts: a request from one of them is taken to come from the address it "
        "forwarded (the console's sign-in limit is per client address) and over its scheme (the session cookie "
        "is Secure over https). Default none: every client is its connection's address, whatever headers it "
        "sends. `lorahost serve` and `lorahost api` pass it to uvicorn (api/http_server.py)",
    )
    max_keys_per_tenant: int = Field(
        default=20,
        gt=0,
        description="API: live (unrevoked) API keys a tenant may hold; creating one more, by the tenant (/v1/keys, "
        "the console) or the operator (/v1/admin/tenants/{id}/keys), is a 409 until one is revoked",
    )

    @field_validator("import_allowed_buckets", mode="before")
    @classmethod
    def _split_bucket_names(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("import_hf_endpoint")
    @classmethod
    def _check_hf_endpoint(cls, value: str) -> str:
        scheme, _, rest = value.partition("://")
        if scheme not in ("https", "http") or not rest.strip("/") or "@" in rest or "?" in rest:
            raise ValueError(
                f"{value!r} is not a Hub endpoint: give its base URL, e.g. https://huggingface.co or "
                "https://hf-mirror.internal (no user info, no query)"
            )
        return value.rstrip("/")

    @field_validator("forwarded_allow_ips", mode="before")
    @classmethod
    def _split_proxy_addresses(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _check_proxy_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not an IP address or network: list the proxies' addresses or networks (e.g. "
                    "10.0.0.0/8); '*' is not accepted, it would let any client choose its address"
                ) from None
        return value

    def resolved_api_instance_id(self, default: str | None = None) -> str:
        """The owner id of this API process's usage rows: api_instance_id, else `default`, else <hostname>-<port>."""
        return self.api_instance_id or default or f"{socket.gethostname()}-{self.port}"


class LimitsSettings(BaseModel):
    """Sizes the platform refuses beyond: uploads, archives, adapter ranks, prompts, completions, bodies."""

    model_config = section_config("")

    max_upload_bytes: int = 512 * 1024 * 1024
    max_uncompressed_bytes: int = 1024 * 1024 * 1024
    max_rank: int = DEFAULT_MAX_LORA_RANK
    max_adapter_bytes: int = 512 * 1024 * 1024
    max_archive_members: int = 8
    max_prompt_tokens: int = 4096
    max_prompt_chars_per_token: int = Field(
        default=32,
        gt=0,
        description="API: a prompt (or chat messages' text) longer than max_prompt_tokens x this many characters "
        "is refused (400) before it is tokenized; no common tokenizer averages more characters per token",
    )
    max_completion_tokens: int = 2048
    max_request_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        gt=0,
        description="API: largest inference request body (413 beyond it, checked while the body is read); keep "
        "it above the largest allowed prompt as JSON (max_prompt_tokens x max_prompt_chars_per_token x ~4)",
    )


class RoutingSettings(BaseModel):
    """How an API server picks a worker: the router policy, its cost knobs, and the listings it reads."""

    model_config = section_config("router_")

    policy: str = Field(
        default=DEFAULT_ROUTER_POLICY,
        description="API: how a request picks its worker, one of scheduler/routing/router_policies.py ROUTER_POLICIES",
    )
    slo_tpot_ms: float | None = Field(
        default=None,
        gt=0,
        description="API, rank_aware router: the time-per-output-token SLO (ms) above which a worker's cost is "
        "penalised; default per worker: 1.5x its single-request decode step at the request's rank (CaraServe)",
    )
    cold_fetch_ms: float = Field(
        default=50.0,
        ge=0,
        description="API, rank_aware router: the estimated fetch (ms) of an adapter a worker holds nowhere, on top "
        "of its profiled host -> device load",
    )
    max_load_gap: float | None = Field(
        default=None,
        ge=0,
        description="API: how much busier (requests per batch slot) the router's preferred worker (a holder of the "
        "adapter, a worker with it resident) may be than the least-loaded ready worker before the request goes to "
        "that one instead (scheduler/routing/router.py yield_to_load). None: residency_least_loaded never yields "
        "(the old behaviour), holders_least_loaded uses 0.0625",
    )
    worker_view_cache_s: float = Field(
        default=0.5,
        ge=0,
        validation_alias="worker_view_cache_s",
        description="API: seconds the live worker listing (Redis) is reused before it is read again (0 = every "
        "request), capped at a quarter of the heartbeat TTL (a dead worker leaves routing soon after its record "
        "expires). While Redis fails, the last listing is used",
    )
    table_refresh_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias="routing_table_refresh_s",
        description="API: seconds between reads of the published routing table into memory",
    )

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        # numpy: loaded when settings are built, not when the package is imported
        from scheduler.routing.router_policies import ROUTER_POLICIES

        return named_choice(value, ROUTER_POLICIES, "router policy")
