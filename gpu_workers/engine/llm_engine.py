"""LLMEngine: add_request / step / abort over the torch-free engine core (scheduler/core/engine_core.py) with
the model runner as its executor (one engine thread; see async_engine.py for the thread-safe streaming
wrapper). The engine adds what needs the tokenizer and tensors: tokenizing prompts, detokenizing outputs and
stop strings, output deltas, and explicit adapter loads (gpu_workers/engine/adapter_placer.py).

Each step the core's `BatchScheduler.schedule()` returns a `StepPlan`; the core carries it out on the
runner: drops the evicted adapters' device copies and starts the planned adapter loads (off the step loop,
gpu_workers/engine/adapter_copier.py: the host copy is read, validated and packed on the preparer thread,
then copied on the copy thread; the engine thread never waits on a cold adapter), then runs the entries
(those of an adapter whose host copy is ready but still copying as CPU-assisted prefills,
layers/host_lora.py; those of an adapter still preparing wait). Prepared host copies and finished copies
are polled at step start and after the forward, landed copies also between layers (the runner switches to
a landed device copy).
The page pool is the one owner of device memory: KV blocks and adapter pages come from
it, and it alone decides how many adapters are on the device (there is no count cap). A request whose
adapter does not fit right now waits in the queue; a load that fails (files changed or vanished, or the
copy failed) ends that adapter's requests with error_code "adapter_unavailable". With prefix caching, the
core's `PrefixCache` owns the pages of cached prompt blocks; a request starting from cached blocks only
computes the rest of its prompt (the model runner reads the block table as usual).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_workers.engine.adapter_placer import AdapterPlacer
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.detokenizer import append_text, find_stop_string, num_held_back_chars
from gpu_workers.engine.engine_stats import RunnerStats, engine_stats, runner_part
from gpu_workers.engine.errors import (
    AdapterInUseError,
    AdapterNotLoadedError,
    DuplicateRequestError,
    PromptTooLongError,
)
from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.model_runner import ModelRunner
from gpu_workers.engine.outputs import CompletionOutput, RequestOutput
from registry.validation import AdapterInfo
from scheduler.admission.admission import BatchPolicy
from scheduler.core.adapter_residency import Residency
from scheduler.core.engine_core import EngineCore, SeqDelta
from scheduler.core.engine_request import EngineRequest, new_sequence, prompt_size_error
from scheduler.core.engine_stats import EngineStats
from scheduler.core.sampling import SamplingParams, TokenLogprob
from scheduler.core.sequence import Sequence
from scheduler.core.structured_output import StructuredOutput


class LLMEngine:
    """Native multi-LoRA engine: continuous batching, paged KV, per-adapter segmented LoRA."""

    def __init__(
        self,
        config: EngineConfig,
        executor: ModelRunner | None = None,
        tokenizer: Any = None,
        clock: Callable[[], float] = time.time,
        *,
        policy: BatchPolicy | None = None,
    ) -> None:
        """`executor`: the model runner (built from `config` when None); `tokenizer`: the model's (loaded from
        `config.model_path` when None); `clock`: the one clock of the engine, its scheduler and its residency
        (request times, policy and eviction ages), wall-clock seconds by default, the times reported to users
        and metering; `policy`: the admission policy (default: the config's)."""
        self.config = config
        self.clock = clock
        self.runner = executor if executor is not None else ModelRunner(config)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(config.model_path))
        self.tokenizer = tokenizer
        self.max_model_len = self.runner.geometry.max_model_len
        self.eos_token_ids = frozenset(self.runner.args.eos_token_ids) | (
            {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        )
        self.runner.eos_token_ids = self.eos_token_ids  # the ids min_tokens masks are those that stop
        self.core = EngineCore(
            self.runner,
            policy or config.admission_policy(),
            config.core_limits(),
            eviction_policy=config.eviction_policy(),
            eos_token_ids=self.eos_token_ids,
            clock=clock,
            text_stop=self._is_stop_string,
        )
        self.pool = self.core.pool
        self.residency = self.core.residency
        self.prefix_cache = self.core.prefix_cache
        self.scheduler = self.core.scheduler
        self.counters = self.core.counters
        self.placer = AdapterPlacer(self.runner, self.core)
        self._request_counter = itertools.count()

    # ---- requests -----------------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises PromptTooLongError, AdapterNotLoadedError, DuplicateRequestError or GrammarError.

        The adapter may be only on the host: give `request.adapter_path` (or register it first); the core
        plans its copy to the device before the request's first step. The prompt's size is checked by the
        rule the worker's prepare applies (`prompt_size_error`): a guard for callers that skip the worker.
        """
        request_id, adapter_id = request.request_id, request.adapter_id
        if self.scheduler.get(request_id) is not None:
            raise DuplicateRequestError(f"request id {request_id!r} is already in the engine")
        adapter_path = request.adapter_path
        if adapter_id is not None and adapter_path is not None and self.residency.get(adapter_id) is None:
            self.register_adapter(adapter_id, adapter_path)
        if adapter_id is not None and self.residency.residency(adapter_id) is Residency.NONE:
            raise AdapterNotLoadedError(
                f"adapter {adapter_id!r} is not loaded; call load_adapter or register_adapter first"
            )
        size_error = prompt_size_error(request.num_prompt_tokens, self.max_model_len)
        if size_error is not None:
            raise PromptTooLongError(size_error)
        structured = request.sampling_params.structured_output
        if structured is not None:  # GrammarError (a ValueError) naming the problem; compiled into the cache
            self.compile_constraint(structured)
        arrival_time = self.clock() if request.arrival_time is None else request.arrival_time
        self.core.add(new_sequence(request, self.max_model_len, arrival_time))

    def compile_constraint(self, structured: StructuredOutput) -> None:
        """Compile an output constraint into the grammar cache (safe beside step(): the async engine calls it
        off the step loop, so add_request finds it compiled); GrammarError naming the problem."""
        self.runner.structured.check(structured)

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        sampling_params: SamplingParams,
        adapter_id: str | None = None,
    ) -> EngineRequest:
        """An EngineRequest for offline use (`generate`): a text prompt is tokenized with the engine's tokenizer."""
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        return EngineRequest(request_id, tuple(token_ids), sampling_params, adapter_id)

    def abort(self, request_id: str) -> bool:
        """Finish a request now (reason "abort"), freeing its pages; False if it is not in the engine."""
        return self.core.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return self.core.has_unfinished_requests()

    # ---- stepping -----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; return a delta for every request that produced a token, finished or was aborted."""
        deltas = self.core.step()
        logprobs = self.runner.take_logprobs()
        return [
            self._delta(d, logprobs.tokens.get(d.seq.request_id), logprobs.prompts.get(d.seq.request_id))
            for d in deltas
        ]

    def _is_stop_string(self, seq: Sequence) -> bool:
        """Detokenize seq's new token; True (text trimmed before it) when the text now holds a stop string."""
        num_chars_before = len(seq.output_text)
        append_text(self.tokenizer, seq)
        if seq.sampling_params.is_stop_held(seq.num_output_tokens):
            return False  # min_tokens: a stop string this early is part of the text
        stop = seq.sampling_params.stop
        stop_at = find_stop_string(seq.output_text, stop, len(seq.output_text) - num_chars_before)
        if stop_at is None:
            return False
        seq.output_text = seq.output_text[:stop_at]
        return True

    def _delta(
        self,
        delta: SeqDelta,
        logprob: TokenLogprob | None = None,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
    ) -> RequestOutput:
        """Build the output delta; text that could still become a stop string is held back until finish.
        `logprob`: the step's sampled token's, when the request needs it (its logprobs, or its cumulative
        logprob: summed here); `prompt_logprobs`: the prompt's, on its first token's delta, when it asked."""
        seq, new_token_ids = delta.seq, delta.new_token_ids
        visible = len(seq.output_text)
        if not seq.is_finished:
            visible = max(seq.num_emitted_chars, visible - num_held_back_chars(seq.sampling_params.stop))
        new_text = seq.output_text[seq.num_emitted_chars : visible]
        seq.num_emitted_chars = visible
        logprobs = None
        if logprob is not None and new_token_ids:
            if seq.cumulative_logprob is not None:
                seq.cumulative_logprob += logprob.logprob
            if seq.sampling_params.logprobs is not None:
                logprobs = [logprob]
        return RequestOutput.of(seq, new_token_ids, new_text, logprobs, prompt_logprobs)

    # ---- offline convenience -------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams],
        adapter_ids: list[str | None] | None = None,
    ) -> list[CompletionOutput]:
        """Run prompts to completion (continuous batching) and return one CompletionOutput per prompt, in order."""
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        adapters = adapter_ids if adapter_ids is not None else [None] * len(prompts)
        if not len(params) == len(adapters) == len(prompts):
            raise ValueError("prompts, sampling_params and adapter_ids must have the same length")
        ids = [f"generate-{next(self._request_counter)}" for _ in prompts]
        seqs: dict[str, Sequence] = {}
        prompt_list: list[str | list[int]] = list(prompts)
        for request_id, prompt, p, adapter_id in zip(ids, prompt_list, params, adapters):
            self.add_request(self.make_request(request_id, prompt, p, adapter_id))
            seqs[request_id] = self.scheduler.get(request_id)  # type: ignore[assignment]
        outs: dict[str, list[RequestOutput]] = {i: [] for i in ids}
        while any(not s.is_finished for s in seqs.values()):
            for out in self.step():
                outs.get(out.request_id, []).append(out)
        return [CompletionOutput.of(seqs[i], outs[i]) for i in ids]

    # ---- adapters -----------------------------------------------------------------------------------

    def inspect_adapter(self, path: Path | str) -> AdapterInfo:
        """Validate an adapter directory against this engine (reads files only; safe beside step())."""
        return self.runner.transfers.validate_adapter(Path(path))

    def register_adapter(self, adapter_id: str, path: Path | str, info: AdapterInfo | None = None) -> None:
        """Validate an adapter's host copy and make it known to the core (host tier; nothing on the device).

        `info` is the result of `inspect_adapter(path)` when the caller validated off the engine lock.
        Raises AdapterLoadError when the files are invalid or the adapter can never fit the page pool.
        """
        info = self.inspect_adapter(path) if info is None else info
        num_bytes = self.runner.adapter_device_bytes(info)
        self.placer.register(
            adapter_id, str(path), info.rank, num_bytes, self.runner.transfers.adapter_num_pages(info)
        )

    def load_adapter(
        self,
        adapter_id: str,
        path: Path | str,
        info: AdapterInfo | None = None,
        *,
        packed: LoraAdapter | None = None,
        load_seconds: float | None = None,
    ) -> None:
        """Validate and put (or reload) an adapter on the device now, through the core's plan (`info` as
        in register_adapter; `packed`: its tensors as `transfers.load_adapter(adapter_id, path, info)` built
        them off the engine lock, in `load_seconds`).

        The pool approves first (idle adapters may be evicted), then the device tensors are built (or the
        packed ones placed); a build that fails cancels the load (AdapterLoadError, the adapter stays on the
        host). Raises AdapterInUseError when reloading one that requests use and AdapterCapacityError when
        the adapters that would have to go are in use.
        """
        info = self.inspect_adapter(path) if info is None else info
        transfers = self.runner.transfers

        def build() -> LoraAdapter:
            return packed if packed is not None else transfers.load_adapter(adapter_id, Path(path), info)

        self.placer.place(
            adapter_id,
            str(path),
            info.rank,
            self.runner.adapter_device_bytes(info),
            transfers.adapter_num_pages(info),
            build,
            load_seconds,
        )

    def prepare_adapter(self, adapter_id: str, path: Path | str) -> LoraAdapter:
        """Validate and pack an adapter's device tensors without touching engine state."""
        info = self.runner.transfers.validate_adapter(Path(path))
        return self.runner.transfers.load_adapter(adapter_id, Path(path), info)

    def install_adapter(
        self, adapter: LoraAdapter, path: Path | str | None = None, load_seconds: float | None = None
    ) -> None:
        """Put an adapter whose tensors the caller built on the device, through the core's plan (idle
        adapters may be evicted); same errors as load_adapter. `load_seconds`: how long building it took
        (the reload cost the eviction policy weighs)."""
        host_path = str(path) if path is not None else None
        self.placer.place(
            adapter.adapter_id,
            host_path,
            adapter.rank,
            adapter.num_bytes,
            self.runner.transfers.num_pages_of(adapter),
            lambda: adapter,
            load_seconds,
        )

    def unload_adapter(self, adapter_id: str) -> None:
        """Drop an adapter; raises AdapterInUseError if requests use it, AdapterNotLoadedError if unknown."""
        if adapter_id not in self.runner.adapters:
            raise AdapterNotLoadedError(f"adapter {adapter_id!r} is not loaded")
        if self.scheduler.is_adapter_in_use(adapter_id):
            raise AdapterInUseError(
                f"adapter {adapter_id!r} is used by running or waiting requests; unload it after they finish"
            )
        self.residency.forget(adapter_id)
        self.runner.drop_adapter(adapter_id)
        self.runner.transfers.forget_host_copies(adapter_id)

    def pin_adapter(self, adapter_id: str) -> None:
        """Lease a registered adapter (e.g. a worker request not yet in the engine): kept on the device
        unless a request ahead needs the room; AdapterNotLoadedError when unknown."""
        if self.residency.get(adapter_id) is None:
            raise AdapterNotLoadedError(f"adapter {adapter_id!r} is not loaded")
        self.residency.pin(adapter_id)

    def unpin_adapter(self, adapter_id: str) -> None:
        """End a lease taken with pin_adapter."""
        self.residency.unpin(adapter_id)

    def adapter_residency(self, adapter_id: str) -> str:
        """ "none", "host", "preparing", "copying" or "device"."""
        return self.residency.residency(adapter_id).value

    def loaded_adapters(self) -> list[str]:
        """Ids of the adapters on the device."""
        return sorted(self.runner.adapters)

    def device_adapters(self) -> list[str]:
        """Ids of the adapters on the device (or being copied), least recently used first."""
        return self.residency.device_adapters()

    # ---- introspection ------------------------------------------------------------------------------

    def engine_stats(self) -> EngineStats:
        """Counts, KV usage, adapter cache counters and step timings, typed (gpu_workers/engine/engine_stats.py)."""
        return engine_stats(self)

    def runner_stats(self) -> RunnerStats:
        """The model runner's part of `engine_stats()` (its `executor`): copies, host tier, LoRA forms, kernels."""
        return runner_part(engine_stats(self))
