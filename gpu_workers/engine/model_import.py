"""Import a base model into the HF safetensors directory that the engine serves (`lorahost import-model`).

Sources:
  - a GGUF file (Llama-family: llama, mistral, qwen2): checked with the `gguf` package (architecture, tensor
    types), then dequantized by transformers (`from_pretrained(dir, gguf_file=...)`);
  - a Hugging Face model directory (config.json + safetensors or PyTorch weights).
The output is written into a temporary sibling of OUT_DIR, checked (the engine's architecture parser and a
weights file), and only then renamed to OUT_DIR: a failed import leaves nothing at OUT_DIR.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_workers.engine.loader import safetensors_files
from gpu_workers.engine.models.llama import SUPPORTED_MODEL_TYPES, ModelArgs

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
DTYPES = ("auto", "float32", "bfloat16", "float16")
_PLAIN_GGUF_TYPES = frozenset({"F32", "F16", "BF16"})
_SUPPORTED_HF_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})


class ModelImportError(ValueError):
    """An import refused: `code` is a short slug, `message` says what is wrong and what to do instead."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ImportedModel:
    """What an import wrote."""

    out_dir: Path
    source_format: str  # "gguf" | "hf"
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str
    num_parameters: int


def import_model(src: Path, out_dir: Path, dtype: str = "auto") -> ImportedModel:
    """Convert SRC (GGUF file or HF directory) into an HF safetensors directory at OUT_DIR (all or nothing)."""
    src, out_dir = Path(src), Path(out_dir)
    if dtype not in DTYPES:
        raise ModelImportError("invalid_dtype", f"dtype {dtype!r} is not one of {list(DTYPES)}")
    _check_out_dir(out_dir)
    source_format = detect_format(src)
    check_gguf(src) if source_format == "gguf" else check_hf_dir(src)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.import-{uuid.uuid4().hex[:8]}"
    try:
        model = _convert(src, source_format, dtype, tmp)
        result = _check_output(tmp, out_dir, source_format, model)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        tmp.rename(out_dir)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelImportError(
            "out_dir_not_empty",
            f"{out_dir} already exists and is not an empty directory; choose a new OUT_DIR",
        )


def detect_format(src: Path) -> str:
    """ "gguf" for a file with the GGUF magic, "hf" for a directory with config.json; else ModelImportError."""
    if src.is_dir():
        if not (src / "config.json").is_file():
            raise ModelImportError(
                "not_a_model",
                f"{src} is a directory without config.json; point at a Hugging Face model directory",
            )
        return "hf"
    if not src.is_file():
        raise ModelImportError("not_found", f"{src} does not exist")
    with src.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelImportError(
            "unsupported_format",
            f"{src} is neither a GGUF file (no GGUF magic) nor a model directory; pass a .gguf file or a "
            "Hugging Face model directory",
        )
    return "gguf"


# ---------------------------------------------------------------------------------------------------------
# GGUF


def check_gguf(path: Path) -> str:
    """Read a GGUF file's header; refuse corrupt files, unsupported architectures and tensor types.

    Returns the architecture (e.g. "llama").
    """
    reader = _read_gguf(path)
    architecture = _gguf_string(reader, "general.architecture")
    if architecture not in SUPPORTED_MODEL_TYPES:
        raise ModelImportError(
            "unsupported_architecture",
            f"{path.name} is a {architecture!r} model; lorahost serves Llama-family models "
            f"{list(SUPPORTED_MODEL_TYPES)}",
        )
    unsupported = sorted({t.tensor_type.name for t in reader.tensors} - supported_gguf_tensor_types())
    if unsupported:
        raise ModelImportError(
            "unsupported_quantization",
            f"{path.name} holds tensors of type {unsupported}, which cannot be dequantized; re-export it "
            f"with one of {sorted(supported_gguf_tensor_types())}",
        )
    return architecture


def _read_gguf(path: Path) -> Any:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # any parse failure means a corrupt or truncated file
        raise ModelImportError(
            "corrupt_file",
            f"{path.name} could not be read as GGUF ({type(exc).__name__}: {exc}); "
            "the file is truncated or corrupt: download it again",
        ) from exc
    if not reader.tensors:
        raise ModelImportError("corrupt_file", f"{path.name} holds no tensors")
    return reader


def _gguf_string(reader: Any, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) else None


@functools.cache
def supported_gguf_tensor_types() -> frozenset[str]:
    """GGUF tensor types the installed `gguf` package can dequantize (probed once on one zero block)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    supported = set(_PLAIN_GGUF_TYPES)
    for qtype in GGMLQuantizationType:
        if qtype.name in supported:
            continue
        _, type_size = GGML_QUANT_SIZES[qtype]
        try:
            dequantize(np.zeros(type_size, dtype=np.uint8), qtype)
        except Exception as exc:  # noqa: BLE001 - NotImplementedError, or any error of a type it cannot read
            logger.debug("GGUF tensor type %s cannot be dequantized: %s", qtype.name, exc)
        else:
            supported.add(qtype.name)
    return frozenset(supported)


# ---------------------------------------------------------------------------------------------------------
# Hugging Face directory


def check_hf_dir(path: Path) -> str:
    """Refuse an HF directory whose config is not a supported architecture or that has no weights."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelImportError("corrupt_file", f"{path}/config.json is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelImportError("corrupt_file", f"{path}/config.json is not a JSON object")
    _check_architecture(config, str(path))
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
    if not has_weights:
        raise ModelImportError(
            "missing_weights",
            f"{path} has no *.safetensors or pytorch_model*.bin weights next to config.json",
        )
    return str(config["model_type"])


def _check_architecture(config: dict[str, Any], where: str) -> None:
    architectures = set(config.get("architectures") or [])
    if architectures and not architectures & _SUPPORTED_HF_ARCHITECTURES:
        raise ModelImportError(
            "unsupported_architecture",
            f"{where} is a {sorted(architectures)} model; lorahost serves "
            f"{sorted(_SUPPORTED_HF_ARCHITECTURES)}",
        )
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        raise ModelImportError(
            "unsupported_quantization",
            f"{where} is quantized ({method}); import the unquantized checkpoint or a GGUF file",
        )
    try:
        ModelArgs.from_hf_config(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelImportError("unsupported_architecture", f"{where}: {exc}") from exc


# ---------------------------------------------------------------------------------------------------------
# Conversion


def _convert(src: Path, source_format: str, dtype: str, tmp: Path) -> Any:
    """Load with transformers and save safetensors + tokenizer into tmp; returns the loaded model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _torch_dtype(dtype, source_format)
    kwargs: dict[str, Any] = {"gguf_file": src.name} if source_format == "gguf" else {}
    model_dir = src.parent if source_format == "gguf" else src
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), **kwargs)
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype, **kwargs)
    except Exception as exc:  # transformers raises many types for bad files
        raise ModelImportError(
            "corrupt_file", f"{src.name} could not be loaded ({type(exc).__name__}: {exc})"
        ) from exc
    _drop_quantization_config(model)
    with quiet_transformers():
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    return model


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bars inside the block (CLI output stays readable); restored afterwards."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)  # the GGUF dequantizer calls tqdm directly
    hf_logging.disable_progress_bar()
    if gguf_tqdm is not None:
        gguf_utils.tqdm = lambda iterable, **_kwargs: iterable
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm


def _torch_dtype(dtype: str, source_format: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.float32 if source_format == "gguf" else "auto"  # dequantized GGUF: full precision
    return getattr(torch, dtype)


def _drop_quantization_config(model: Any) -> None:
    """A dequantized GGUF model carries a GgufConfig; saved as-is, loaders would expect quantized weights."""
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False


def _check_output(tmp: Path, out_dir: Path, source_format: str, model: Any) -> ImportedModel:
    config = json.loads((tmp / "config.json").read_text())
    _check_architecture(config, "the converted model")
    safetensors_files(tmp)  # raises if nothing was written
    args = ModelArgs.from_hf_config(config)
    return ImportedModel(
        out_dir=out_dir,
        source_format=source_format,
        model_type=args.model_type,
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        vocab_size=args.vocab_size,
        dtype=str(config.get("dtype") or config.get("torch_dtype")),
        num_parameters=sum(p.numel() for p in model.parameters()),
    )
