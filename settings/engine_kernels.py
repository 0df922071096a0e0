"""The engine's kernel knobs (LORAHOST_ENGINE_*): dtype, device, threads, the forced kernel forms, captured
decode steps and the compile budget; one of the concern classes EngineSettings composes (settings/engine.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from settings.engine_section import EngineSection

DTYPE_NAMES = ("bfloat16", "float16", "float32")
DEVICES = ("auto", "cpu", "cuda")
# Forced kernel choices (gpu_workers/engine/kernel_plan.py): setting -> its forms (= the ops' forms in gpu_workers/engine/layers/)
KERNEL_FORMS = {
    "linear_weights": ("plain", "packed"),
    "prefill_gemm": ("packed", "fp32_upcast", "plain"),
    "decode_attention": ("sdpa", "sdpa_fp32", "grouped_matmul", "c_kernel", "triton"),
    "prefill_attention": ("sdpa", "triton"),
    "decode_lora_form": ("segmented", "stacked", "kernel", "sgmv", "bgmv"),
    "decode_step": ("eager", "compiled"),
}


class EngineKernelSettings(EngineSection):
    """Kernels: the compute dtype, the device, the CPU threads, the forced forms of the engine's ops, and how
    decode steps are captured (CUDA graphs) or compiled (CPU)."""

    dtype: str = Field(default="auto", description="bfloat16, float16, float32 or auto")
    device: str = Field(default="auto", description="cpu, cuda or auto")
    num_threads: int | None = Field(default=None, description="torch CPU threads (default: torch's)")
    fp32_prefill_gemms: bool | None = Field(
        default=None,
        description="bf16 model on CPU: prefill-sized products (>= 128 rows) in fp32 upcasts; default: chosen by "
        "measurement at worker start (cached per CPU, torch version, threads and shape); costs a dense copy of "
        "the weights",
    )
    kernel_choices_path: Path | None = Field(
        default=None,
        description="JSON cache of the CPU kernels chosen by measurement (gpu_workers/engine/kernel_tuner.py); "
        "default ~/.cache/lorahost/kernel_choices.json",
    )
    linear_weights: str | None = Field(
        default=None,
        description="force the form of the projections' weights on CPU (plain / packed: oneDNN-packed); default: "
        "chosen by measurement at worker start where oneDNN can pack the dtype (`lorahost tune`)",
    )
    prefill_gemm: str | None = Field(
        default=None,
        description="force the prefill GEMM form of a packed bf16 model (packed / fp32_upcast / plain); default: "
        "chosen by measurement at worker start (`lorahost tune`); wins over engine_fp32_prefill_gemms",
    )
    decode_attention: str | None = Field(
        default=None,
        description="force the decode attention form (sdpa / sdpa_fp32 / grouped_matmul / c_kernel: CPU / triton: "
        "CUDA with triton); default: chosen by measurement at worker start",
    )
    prefill_attention: str | None = Field(
        default=None,
        description="force the prefill attention form (sdpa / triton: one varlen kernel over the KV pages, CUDA "
        "with triton); default: sdpa where it is the only usable form, else chosen by measurement at worker start",
    )
    decode_lora_form: str | None = Field(
        default=None,
        description="force the LoRA form of a step (segmented / stacked / kernel: CPU / sgmv / bgmv: CUDA, Triton); "
        "default: chosen by measurement at worker start among the forms that can run there",
    )
    lora_kernel: bool | None = Field(
        default=None,
        description="C/OpenMP CPU kernel for decode-sized LoRA segments (built at start with the system C "
        "compiler, cached); default: on where it builds; false: the torch forms",
    )
    decode_step: str | None = Field(
        default=None,
        description="force how a CPU worker runs a decode step's elementwise work (eager / compiled: "
        "torch.compile'd norms, rotary and SwiGLU); default: chosen by measurement at worker start on CPU "
        "(cached; eager on CUDA, where decode steps are captured instead)",
    )
    onednn_cache_capacity: int = Field(
        default=128,
        description="products each of torch's two oneDNN caches (ideep's and oneDNN's primitive cache) keeps in "
        "a worker process; every new (rows, in, out) shape of a bf16 product on CPU keeps 0.5-0.7 MiB in them until "
        "its capacity (torch's default: 1,024 each, over 1 GiB); applied before the process's first engine runs "
        "a product, unless LRU_CACHE_CAPACITY / ONEDNN_PRIMITIVE_CACHE_CAPACITY are set",
    )
    compile_budget_s: float = Field(
        default=120.0,
        description="CPU: the most seconds the kernel tuner lets compiling the decode step take; a slower "
        "compile loses the measurement (the choice is cached, so later starts do not compile again)",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="CUDA: capture decode steps in CUDA graphs at worker start, one per padded batch-size "
        "bucket, adapter slots and page tables as graph inputs (docs/engines.md, 'Captured decode steps'); "
        "false: every step runs eagerly. No effect on CPU",
    )
    cuda_graph_max_batch_size: int = Field(
        default=64,
        description="CUDA: the largest decode batch captured (buckets 1, 2, 4, 8, 16, 24, ... up to it and "
        "engine_max_num_seqs); larger batches run eagerly",
    )
    cuda_graph_capture_budget_s: float = Field(
        default=60.0,
        description="CUDA: seconds the capture at worker start may take; buckets left when it is spent run "
        "eagerly",
    )
    cuda_graph_max_pool_bytes: int = Field(
        default=1 << 30,
        description="CUDA: device bytes the captured graphs' shared memory pool may take; capture stops "
        "once it is reached",
    )

    @field_validator("dtype")
    @classmethod
    def _check_dtype(cls, value: str, info: ValidationInfo) -> str:
        return cls._choice(value, (*DTYPE_NAMES, "auto"), info)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str, info: ValidationInfo) -> str:
        return cls._choice(value, DEVICES, info)

    @field_validator(*KERNEL_FORMS)
    @classmethod
    def _check_kernel_form(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else cls._choice(value, KERNEL_FORMS[str(info.field_name)], info)

    @field_validator(
        "onednn_cache_capacity",
        "compile_budget_s",
        "cuda_graph_max_batch_size",
        "cuda_graph_capture_budget_s",
        "cuda_graph_max_pool_bytes",
    )
    @classmethod
    def _check_positive_kernels(cls, value: float, info: ValidationInfo) -> float | None:
        return cls._positive(value, info)
