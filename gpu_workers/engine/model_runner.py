"""The model runner owns every tensor: weights, paged KV cache, device copies of adapters; it turns a
scheduled batch into tensors, runs the model and samples. Which adapters are on the device is decided by
the engine core (scheduler/core/); the engine changes `adapters` only when it carries out a step plan."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from pathlib import Path

import torch

from gpu_workers.engine.adapter_transfers import AdapterTransfers
from gpu_workers.engine.compiled_decode import compile_pointwise
from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.decode_graphs import DecodeGraphs, build_decode_graphs, graphs_unusable_reason
from gpu_workers.engine.engine_stats import RunnerStats, runner_stats
from gpu_workers.engine.host_malloc import keep_large_allocations_on_heap
from gpu_workers.engine.kernel_plan import KernelPlan, plan_kernels
from gpu_workers.engine.kernel_tuner import KernelTuner
from gpu_workers.engine.layers import cpu_kernels
from gpu_workers.engine.layers.dora import magnitude_columns
from gpu_workers.engine.layers.host_lora import HostLora
from gpu_workers.engine.layers.logits_processors import RowHistory
from gpu_workers.engine.layers.logprobs import StepLogprobs, prompt_logprobs
from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraBatch
from gpu_workers.engine.layers.rotary import RotaryEmbedding
from gpu_workers.engine.layers.sampler import sample
from gpu_workers.engine.layers.vocab_lora import VocabStep, select_head_rows
from gpu_workers.engine.loader import iter_safetensors, read_hf_config, safetensors_files
from gpu_workers.engine.lora_form_choice import LoraForms, lora_segments
from gpu_workers.engine.models.llama import LlamaForCausalLM, ModelArgs
from gpu_workers.engine.onednn_cache import bound_onednn_caches
from gpu_workers.engine.step_graph import CudaStepGraphs, StepGraphsFactory
from gpu_workers.engine.step_inputs import StepInputs, build_step_inputs
from gpu_workers.engine.structured_rows import StructuredRows, apply_masks
from registry.validation import AdapterInfo, BaseModelSpec
from scheduler.core.executor import CopyResult, PrepareResult
from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from scheduler.core.sampling import TokenLogprob
from scheduler.core.sequence import BatchEntry, Sequence


class ModelRunner:
    """Weights + KV cache + adapters on one device; `execute` runs one scheduled batch. Adapter loading,
    placement and host -> device copies are in `transfers` (gpu_workers/engine/adapter_transfers.py); the LoRA form
    of each step in `lora_forms` (gpu_workers/engine/lora_form_choice.py). The engine core's `Executor`
    (scheduler/core/executor.py): `run_step`, the adapter copy methods, `geometry` and `stats`.

    `weights`: HF-named tensors to load instead of the safetensors files under `config.model_path` (which then
    needs only its config.json); benchmarks hand in random weights made on the device, so an 8B-shaped model
    needs no 16 GB checkpoint (benchmarks/gpu_engine_bench.py).

    Decode steps are replayed from recordings where they can be (`decode_graphs`, gpu_workers/engine/decode_graphs.py:
    CUDA graphs on a GPU); `step_graphs` makes the recordings instead of the device's own backend (the CPU tests'
    eager replay, gpu_workers/engine/step_graph.py). `graphs_off_reason` says why nothing is captured.
    """

    def __init__(
        self,
        config: EngineConfig,
        weights: Iterable[tuple[str, torch.Tensor]] | None = None,
        *,
        step_graphs: StepGraphsFactory | None = None,
    ) -> None:
        self.config = config
        self.device = config.resolved_device()
        self.dtype = config.resolved_dtype()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        bound_onednn_caches(config.onednn_cache_capacity)  # before kernel tuning runs the first bf16 product
        if self.device.type == "cpu" and config.tune_host_malloc:
            keep_large_allocations_on_heap()
        hf_config = read_hf_config(config.model_path)
        self.args = ModelArgs.from_hf_config(hf_config)
        # CPU kernels chosen by measurement on this machine and the model's shapes (cached, gpu_workers/engine/kernel_plan.py)
        self.kernel_tuner = KernelTuner(config.kernel_choices_path)
        self.kernel_plan: KernelPlan = plan_kernels(
            self.kernel_tuner, config, self.args, self.dtype, self.device
        )
        self.use_packed_linears = self.kernel_plan.is_packed_linears
        self.wide_gemm_dtype = self.kernel_plan.wide_gemm_dtype if self.use_packed_linears else None
        self.model = self._load_model(weights)
        self.block_size = config.block_size
        self.geometry = MemoryGeometry.plan(
            ModelShape.from_hf_config(hf_config),
            element_size=torch.empty((), dtype=self.dtype).element_size(),
            block_size=config.block_size,
            memory_mode=config.memory_mode,
            kv_cache_bytes=config.kv_cache_bytes,
            num_kv_blocks=config.num_kv_blocks,
            adapter_cache_bytes=config.adapter_cache_bytes,
            max_lora_rank=config.max_lora_rank,
            max_model_len=config.max_model_len,
        )
        self.num_kv_blocks = self.geometry.num_kv_blocks
        self.max_model_len = self.geometry.max_model_len
        self.rotary = RotaryEmbedding(
            self.args.head_dim, max(self.max_model_len, 1), self.args.rope, self.dtype, self.device
        )
        self.graphs_off_reason = graphs_unusable_reason(
            config, self.device, self.dtype, self.kernel_plan, is_device_backend=step_graphs is None
        )
        # captured steps' padding rows write their K/V to one extra page, past the pool's pages
        num_padding_pages = 1 if self.graphs_off_reason is None else 0
        self.kv_caches = self._allocate_kv_cache(self.num_kv_blocks + num_padding_pages)
        self.adapters: dict[str, LoraAdapter] = {}
        self.cpu_kernels_compile_s = cpu_kernels.compile_seconds  # None: loaded from the cache (or none)
        self.lora_forms = LoraForms(
            self.kernel_plan,
            config.lora_stack_cache_size,
            self.use_packed_linears,
            self.device,
            self.adapters,
            magnitude_columns({p: getattr(self.model.layers[0], p).output_slices for p in PROJECTIONS}),
        )
        self.transfers = AdapterTransfers(
            config, self.model, BaseModelSpec.from_hf_config(hf_config), self.kv_caches, self.adapters,
            is_unified=self.is_unified, page_numel=self.page_numel, device=self.device, dtype=self.dtype,
        )  # fmt: skip
        self.host_switch_layer: int | None = None  # test hook, see layers/host_lora.LayerSwitch
        self.last_switched_at: dict[str, int] = {}  # last host-assisted step: adapter -> first device layer
        self.generators: dict[str, torch.Generator] = {}
        # min_tokens masks these (LLMEngine widens them with the tokenizer's EOS); request id -> the logprob of
        # its token sampled by the last step, for rows that asked (`take_logprobs`)
        self.eos_token_ids: frozenset[int] = frozenset(self.args.eos_token_ids)
        self.step_logprobs = StepLogprobs()
        # request id -> position -> next token's
        self.prompt_logprobs: dict[str, dict[int, TokenLogprob]] = {}
        self.sampled_head: VocabStep | None = None  # the last eager step's lm_head LoRA of its sampled rows
        self.default_generator = torch.Generator(device=self.device).manual_seed(config.seed)
        # structured outputs: a grammar matcher per constrained request, masks computed during the forward pass
        self.structured = StructuredRows(config.model_path, self.args.vocab_size, self.args.eos_token_ids)
        self.decode_step_compile_s: float | None = None  # None: the decode step runs eagerly
        if self.kernel_plan.decode_step == "compiled":
            ops, self.decode_step_compile_s = compile_pointwise(self.args, self.dtype, self.device)
            self.model.use_pointwise(ops)
        self.decode_graphs: DecodeGraphs | None = None
        if self.graphs_off_reason is None:
            make_graphs = step_graphs or CudaStepGraphs
            self.decode_graphs = build_decode_graphs(
                make_graphs(self.device), config, self.model, self.rotary, self.kv_caches, self.kernel_plan,
                pad_page=self.num_kv_blocks, max_model_len=self.max_model_len,
            )  # fmt: skip

    # ---- setup -------------------------------------------------------------------------------------

    def _load_model(self, weights: Iterable[tuple[str, torch.Tensor]] | None) -> LlamaForCausalLM:
        model = LlamaForCausalLM(self.args, self.dtype, self.device)
        if weights is None:
            weights = iter_safetensors(safetensors_files(self.config.model_path))
        model.load_weights(weights)
        if self.use_packed_linears:
            model.pack_linears(self.wide_gemm_dtype)
        return model.eval()

    def kv_bytes_per_block(self) -> int:
        """Bytes of K and V for one block across all layers."""
        return self.geometry.kv_bytes_per_block

    @property
    def is_unified(self) -> bool:
        """True when adapters live in the KV cache's pages (memory_mode "unified")."""
        return self.geometry.is_unified

    @property
    def page_numel(self) -> int:
        """Elements of K (or of V) one page holds in one layer."""
        return self.geometry.page_numel

    def adapter_row_bytes(self) -> int:
        """Device bytes of one rank row of an adapter that targets every projection of every layer."""
        return self.geometry.shape.adapter_row_bytes(self.geometry.element_size)

    def num_adapter_pages(self) -> int:
        """Pool pages only adapters use (static split); 0 in a unified pool (adapters take KV pages)."""
        return self.geometry.num_adapter_pages

    def adapter_device_bytes(self, info: AdapterInfo) -> int:
        """Device bytes an adapter will take (its weight file's bytes rescaled to the engine dtype)."""
        return self.geometry.adapter_device_bytes(info.num_bytes, info.dtype)

    def _allocate_kv_cache(self, num_pages: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Per layer: [num_pages * block_size, num_kv_heads, head_dim] (flat slot view of the page pool).
        shape = (num_pages * self.block_size, self.args.num_kv_heads, self.args.head_dim)
        return [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(self.args.num_layers)
        ]

    # ---- one step ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(
        self,
        entries: list[BatchEntry],
        return_logits: bool = False,
        host_assisted: frozenset[str] | set[str] = frozenset(),
    ) -> tuple[list[int | None], torch.Tensor | None]:
        """Run one batch (entries sorted by adapter) -> sampled token per sampling entry (+ their logits).

        A pure decode step is replayed from its bucket's recording where one fits (`decode_graphs`), else every
        step runs eagerly (`forward`). Entries of a `host_assisted` adapter (still being copied; prefills only)
        get their LoRA delta from the adapter's host copy on the CPU pool until its device copy lands (then from
        the next layer on). A row whose logits are not all finite (an adapter whose weights overflow) gets None
        instead of a token and is not sampled, so it cannot fail its batch neighbours' sampling.
        """
        hidden, head = None, None
        sampling = [e for e in entries if e.is_sampling]
        masks = self.structured.start(sampling)  # computed on a thread while the model runs
        if self.decode_graphs is not None and not host_assisted:
            hidden = self.decode_graphs.run(entries, self.adapters)  # [num_entries, hidden]: all sample
        if hidden is None:
            hidden = self.forward(entries, frozenset(host_assisted))  # [num_sampling, hidden]
            head = self.sampled_head  # (a recorded step has no embed_tokens / lm_head LoRA rows)
        if not sampling:
            return [], None
        logits = self.model.logits(hidden, head)  # [num_sampling, vocab]
        # one check for all sampled rows: x * 0 is 0 for finite x and NaN for inf / NaN (a sum cannot overflow)
        is_finite = torch.isfinite(logits.mul(0.0).sum(dim=-1)).tolist()
        if masks is not None:  # after the check: a masked logit is -inf on purpose
            apply_masks(logits, masks.result())
        tokens = self._sample(logits, sampling, is_finite)
        return tokens, (logits if return_logits else None)

    @torch.inference_mode()
    def forward(self, entries: list[BatchEntry], host_assisted: frozenset[str] = frozenset()) -> torch.Tensor:
        """The step run eagerly -> final hidden states of the sampling entries [num_sampling, hidden]."""
        inputs = self.prepare(entries, host_assisted)
        cos_sin = self.rotary.lookup(inputs.positions)
        output_rows = inputs.sample_rows if inputs.output_rows is None else inputs.output_rows
        hidden = self.model(
            inputs.input_ids, cos_sin, self.kv_caches, inputs.attention, inputs.lora, output_rows=output_rows
        )  # [num_sampling, hidden] (or [num_output_rows, hidden] with prompt rows)
        head = select_head_rows(inputs.lora.find(VocabStep), output_rows)  # lm_head LoRA of hidden's rows
        if inputs.sample_index is not None:
            self._record_prompt_logprobs(hidden, inputs, head)
            hidden = hidden.index_select(0, inputs.sample_index)
            head = select_head_rows(head, inputs.sample_index)
        self.sampled_head = head
        host = inputs.lora.find(HostLora)
        if host is not None:
            switched_at = host.switch.switched_at
            self.last_switched_at = {a: switched_at.get(a, self.args.num_layers) for a in host_assisted}
        return hidden

    def _sample(
        self, logits: torch.Tensor, sampling: list[BatchEntry], is_finite: list[bool]
    ) -> list[int | None]:
        """Sample the rows with finite logits (their logprobs kept for `take_logprobs`); None for the others."""
        rows = [i for i, ok in enumerate(is_finite) if ok]
        if len(rows) < len(sampling):
            logits = logits[rows]
        seqs = [sampling[i].seq for i in rows]
        if not seqs:
            return [None] * len(sampling)
        params = [seq.sampling_params for seq in seqs]
        generators = [self._generator_for(seq) for seq in seqs]
        histories = [RowHistory(seq.token_ids, seq.num_prompt_tokens) for seq in seqs]
        result = sample(logits, params, generators, histories, self.eos_token_ids)
        for seq, logprob in zip(seqs, result.logprobs):
            if logprob is not None:
                self.step_logprobs.tokens[seq.request_id] = logprob
            if seq.sampling_params.prompt_logprobs is not None and seq.num_output_tokens == 0:
                self.step_logprobs.prompts[seq.request_id] = self._take_prompt_logprobs(seq)
        sampled = iter(result.tokens)
        return [next(sampled) if ok else None for ok in is_finite]

    def _record_prompt_logprobs(
        self, hidden: torch.Tensor, inputs: StepInputs, head: VocabStep | None
    ) -> None:
        """Keep the logprobs of the prompt rows' next tokens, by position (a recomputed position overwrites)."""
        for rows in inputs.prompt_rows:
            row_head = select_head_rows(head, rows.output_index)
            logits = self.model.logits(hidden[rows.output_index], row_head)  # [num_positions, vocab]
            num_top = rows.seq.sampling_params.prompt_logprobs or 0
            kept = self.prompt_logprobs.setdefault(rows.seq.request_id, {})
            kept.update(zip(rows.positions, prompt_logprobs(logits, rows.target_ids, num_top)))

    def _take_prompt_logprobs(self, seq: Sequence) -> list[TokenLogprob | None]:
        """Remove and return seq's prompt logprobs, one per prompt token (None for the first, as OpenAI)."""
        kept = self.prompt_logprobs.pop(seq.request_id, {})
        return [None, *(kept.get(p) for p in range(seq.num_prompt_tokens - 1))]

    def take_logprobs(self) -> StepLogprobs:
        """Remove and return the sampled tokens' and finished prompts' logprobs since the last call."""
        taken, self.step_logprobs = self.step_logprobs, StepLogprobs()
        return taken

    def _generator_for(self, seq: Sequence) -> torch.Generator | None:
        if seq.sampling_params.is_greedy:
            return None
        if seq.sampling_params.seed is None:
            return self.default_generator
        gen = self.generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seq.sampling_params.seed)
            self.generators[seq.request_id] = gen
        return gen

    def release_request(self, request_id: str) -> None:
        """Drop per-request sampler state (its generator, its grammar matcher)."""
        self.generators.pop(request_id, None)
        self.prompt_logprobs.pop(request_id, None)
        self.structured.release(request_id)

    # ---- the engine core's executor ----------------------------------------------------------------

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        """`execute` without logits: one sampled token (or None) per sampling entry."""
        tokens, _ = self.execute(entries, host_assisted=frozenset(host_assisted))
        return tokens

    @torch.inference_mode()
    def move_kv_blocks(self, moves: list[tuple[int, int]]) -> None:
        """Copy each (old, new) page's K and V in every layer (the core moved them out of an adapter's run;
        distinct pages, so one gather and one scatter per tensor). On CUDA the engine's stream is synchronized
        after it: an adapter copy, on a side stream, may write the old pages as soon as its host copy is ready."""
        if not moves:
            return
        old = torch.tensor([o for o, _ in moves], dtype=torch.long, device=self.device)
        new = torch.tensor([n for _, n in moves], dtype=torch.long, device=self.device)
        for k_cache, v_cache in self.kv_caches:
            for cache in (k_cache, v_cache):
                pages = cache.view(
                    -1, self.block_size, *cache.shape[1:]
                )  # [num_pages, block_size, heads, dim]
                pages.index_copy_(0, new, pages.index_select(0, old))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        """Start an adapter's load off the step loop: its host copy prepared, then copied into its pages."""
        self.transfers.start_adapter_copy(adapter_id, Path(host_path or ""), page_ids)

    def take_prepared_copies(self) -> list[PrepareResult]:
        """The host copies made (or that could not be made) since the last call."""
        return [
            PrepareResult(
                job.adapter_id,
                job.prepare_seconds,
                job.error if job.host_copy is None else None,
                is_from_host_tier=job.is_from_host_tier,
            )
            for job in self.transfers.take_prepared_copies()
        ]

    def take_finished_copies(self) -> list[CopyResult]:
        """The copies that landed or failed since the last call."""
        return [
            CopyResult(job.adapter_id, job.seconds, None if job.error is None else str(job.error))
            for job in self.transfers.take_finished_copies()
        ]

    def has_copies_in_flight(self) -> bool:
        """True while a started load (preparing or copying) has not been taken."""
        return self.transfers.copier.has_in_flight()

    def wait_for_copy(self, timeout_s: float) -> None:
        """Block until some preparation or copy finished or `timeout_s` passed."""
        self.transfers.copier.wait_any(timeout_s)

    def drop_adapter(self, adapter_id: str) -> None:
        """Cancel the adapter's copy and drop its device tensors (the core already freed its pages)."""
        self.transfers.cancel_adapter_copy(adapter_id)
        self.adapters.pop(adapter_id, None)
        self.forget_adapter(adapter_id)

    def stats(self) -> RunnerStats:
        """What the runner measures itself (gpu_workers/engine/engine_stats.py `runner_stats`)."""
        return runner_stats(self)

    def prepare(self, entries: list[BatchEntry], host_assisted: frozenset[str] = frozenset()) -> StepInputs:
        """Build token ids, positions, slot mappings, attention and LoRA segment metadata for one step."""
        lora = self._lora_batch(entries, host_assisted)
        plan = self.kernel_plan
        return build_step_inputs(
            entries, lora, self.block_size, plan.decode_attention, self.device, plan.prefill_attention
        )

    def _lora_batch(self, entries: list[BatchEntry], host_assisted: frozenset[str]) -> LoraBatch:
        """Contiguous token ranges per adapter (entries are already sorted by adapter) in the form
        `lora_forms` picks; one host segment per entry of a host-assisted adapter."""
        segments, host_segments, num_tokens = lora_segments(
            entries, self.adapters, self.transfers.host_copies, host_assisted
        )
        host = None
        if host_segments:
            host = self.transfers.host_lora(host_segments, host_assisted, self.host_switch_layer)
        return self.lora_forms.batch(segments, num_tokens, host)

    def forget_adapter(self, adapter_id: str) -> None:
        """Drop cached LoRA forms and the captured steps' slot of an adapter (call when it is unloaded or
        replaced)."""
        self.lora_forms.forget(adapter_id)
        if self.decode_graphs is not None:
            self.decode_graphs.forget(adapter_id)
