"""The rules' vocabulary: accepted names, dtypes and limits, the base model spec, what a valid adapter is,
and the refusal type (`AdapterValidationError`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from registry.base_norms import BaseWeightNorms, base_weight_norms
from settings.api import DEFAULT_MAX_LORA_RANK

DECODER_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# LoRA on the token embedding and the LM head (peft target_modules of those names; not modules_to_save copies)
VOCAB_TARGET_MODULES = ("embed_tokens", "lm_head")
SUPPORTED_TARGET_MODULES = DECODER_TARGET_MODULES + VOCAB_TARGET_MODULES
VOCAB_LAYER = (
    -1
)  # the "layer" parse_lora_tensor_name gives embed_tokens / lm_head tensors (outside the layers)
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_TASK_TYPES = (None, "CAUSAL_LM")
DECODER_LAYERS_PATTERN = "layers"  # the ModuleList holding the decoder layers (model.layers.N) in peft's keys
CONFIG_FILENAME = "adapter_config.json"
WEIGHTS_FILENAME = "adapter_model.safetensors"
IGNORED_FILENAMES = frozenset({"README.md"})  # written by peft's save_pretrained; accepted and ignored
ALLOWED_FILENAMES = frozenset({CONFIG_FILENAME, WEIGHTS_FILENAME}) | IGNORED_FILENAMES
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_CONFIG_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 4 * 1024 * 1024  # bounded memory for hashing and finiteness checks

_MODULE_PARENT = {m: "self_attn" for m in DECODER_TARGET_MODULES[:4]} | {
    m: "mlp" for m in DECODER_TARGET_MODULES[4:]
}
# peft's module path of each vocabulary module (its keys: base_model.model.<path>.<tensor>)
_VOCAB_MODULE_PATH = {"embed_tokens": "model.embed_tokens", "lm_head": "lm_head"}
# safetensors dtype -> bytes per element (all dtypes the format defines, so sizes can be checked)
_DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# accepted dtypes -> the name the engine uses (torch attribute names, e.g. torch.bfloat16)
SUPPORTED_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_TENSOR_NAME = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(0|[1-9][0-9]*)\.(self_attn|mlp)\.([A-Za-z0-9_]+)"
    r"\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
)
# the name's last part -> its side: lora_A, lora_B, or DoRA's magnitude vector "M" ([out_features])
_TENSOR_SIDES = {"lora_A.weight": "A", "lora_B.weight": "B", "lora_magnitude_vector": "M"}
_VOCAB_TENSOR_NAME = re.compile(
    r"^(?:base_model\.model\.)?(model\.embed_tokens|lm_head)"
    r"\.(lora_embedding_A|lora_embedding_B|lora_A\.weight|lora_B\.weight|base_layer\.weight|weight)$"
)
# per vocabulary module, its LoRA tensors' last parts -> side (peft's Embedding layer names them lora_embedding_*)
_VOCAB_TENSOR_SIDES = {
    "embed_tokens": {"lora_embedding_A": "A", "lora_embedding_B": "B"},
    "lm_head": {"lora_A.weight": "A", "lora_B.weight": "B"},
}
_UNSUPPORTED_CONFIG_OPTIONS = (  # set (non-null, non-false, non-empty) => refused
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "megatron_config",
    "fan_in_fan_out",
)


class AdapterValidationError(ValueError):
    """An upload refused: `code` is a short slug, `message` says what is wrong and what to change."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _fail(code: str, message: str) -> AdapterValidationError:
    return AdapterValidationError(code, message)


# ---------------------------------------------------------------------------------------------------------
# Base model and limits


@dataclass(frozen=True)
class BaseModelSpec:
    """The linear-layer dimensions of a Llama-family base model, from its Hugging Face config.json."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    model_dir: Path | None = field(default=None, compare=False, repr=False)  # for the base weight norms
    # the base weight norms recorded when the model was added to the catalog (its weights need not be local)
    stored_norms: BaseWeightNorms | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_hf_config(cls, config: dict) -> BaseModelSpec:
        """Build from a parsed config.json (model_type llama, mistral or qwen2)."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise _fail(
                "unsupported_base_model",
                f"base model type {model_type!r} is not supported; use one of {list(SUPPORTED_MODEL_TYPES)}",
            )
        try:
            num_heads = int(config["num_attention_heads"])
            hidden_size = int(config["hidden_size"])
            return cls(
                model_type=model_type,
                hidden_size=hidden_size,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
                head_dim=int(config.get("head_dim") or hidden_size // num_heads),
                vocab_size=int(config["vocab_size"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail("unsupported_base_model", f"base model config.json is incomplete: {exc!r}") from exc

    @classmethod
    def from_model_dir(cls, path: Path) -> BaseModelSpec:
        """Build from a Hugging Face model directory holding config.json (and its safetensors, whose weight
        norms bound adapters' updates; see the module docstring)."""
        spec = cls.from_hf_config(json.loads((Path(path) / "config.json").read_text()))
        return replace(spec, model_dir=Path(path))

    @property
    def weight_norms(self) -> BaseWeightNorms | None:
        """(layer, module) -> Frobenius norm of the base weight; None without readable base weights."""
        if self.stored_norms is not None:
            return self.stored_norms
        return base_weight_norms(self.model_dir) if self.model_dir is not None else None

    def module_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of one supported module: a linear module of a decoder layer, lm_head
        (hidden -> vocab), or embed_tokens as peft's LoRA sees it (vocab -> hidden: lora_embedding_A [r, vocab],
        lora_embedding_B [hidden, r])."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden_size, q_size),
            "k_proj": (self.hidden_size, kv_size),
            "v_proj": (self.hidden_size, kv_size),
            "o_proj": (q_size, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
            "embed_tokens": (self.vocab_size, self.hidden_size),
            "lm_head": (self.hidden_size, self.vocab_size),
        }
        if module not in shapes:
            raise _fail("unsupported_target_module", _unsupported_module_message(module))
        return shapes[module]


@dataclass(frozen=True)
class ValidationLimits:
    """Upper bounds on what a tenant may upload."""

    max_rank: int = DEFAULT_MAX_LORA_RANK
    max_adapter_bytes: int = 512 * 1024 * 1024
    max_uncompressed_bytes: int = 1024 * 1024 * 1024
    max_archive_members: int = 8
    max_header_bytes: int = 8 * 1024 * 1024  # safetensors JSON header
    # numeric bounds (see the module docstring for the reasoning)
    max_lora_alpha: float = 16384.0
    max_lora_scale: float = 1024.0
    max_abs_weight: float = 256.0  # on |lora_A| and on |scale * lora_B| (the weights the engine holds)
    max_delta_ratio: float = 1024.0  # scale * ||B||_F * ||A||_F <= this * ||W_base||_F


@dataclass(frozen=True)
class LoraConfigInfo:
    """The accepted fields of an adapter_config.json."""

    rank: int
    alpha: float
    use_rslora: bool
    scale: float
    target_modules: tuple[str, ...]  # short names, in SUPPORTED_TARGET_MODULES order
    base_model_name_or_path: str | None
    layers_to_transform: frozenset[int] | None = None  # None: every layer may carry weights
    exclude_modules: tuple[str, ...] = ()  # peft list form: a module name or a suffix of its path
    use_dora: bool = False  # DoRA: every adapted module also has a magnitude vector

    def is_targeted(self, layer: int, module: str) -> bool:
        """True when peft would put LoRA on `module` of decoder `layer` (VOCAB_LAYER for embed_tokens and
        lm_head) under this config. Under layers_to_transform peft skips a module whose path has no layer index
        (embed_tokens) unless its whole path is a target: "lm_head" is (a top-level module of the model)."""
        if module not in self.target_modules:
            return False
        if (
            self.layers_to_transform is not None
            and module != "lm_head"
            and layer not in self.layers_to_transform
        ):
            return False
        if module in _VOCAB_MODULE_PATH:
            key = _VOCAB_MODULE_PATH[module]
        else:
            key = f"model.layers.{layer}.{_MODULE_PARENT[module]}.{module}"
        return not any(key == name or key.endswith("." + name) for name in self.exclude_modules)


@dataclass(frozen=True)
class AdapterInfo:
    """What the platform records about a valid adapter."""

    rank: int
    alpha: float
    use_rslora: bool
    scale: float
    target_modules: tuple[str, ...]
    dtype: str  # "float16" | "bfloat16" | "float32"
    num_bytes: int  # size of adapter_model.safetensors
    num_tensors: int
    sha256: str  # hex digest of adapter_model.safetensors
    base_model_name_or_path: str | None
    layers: tuple[int, ...]  # decoder layers with LoRA weights, sorted
    use_dora: bool = False  # DoRA (weight-decomposed LoRA): a magnitude vector per adapted module


def _unsupported_module_message(module: Any) -> str:
    return (
        f"LoRA on {module!r} is not supported; adapters may target only the decoder linear layers "
        f"{list(DECODER_TARGET_MODULES)}, the token embedding 'embed_tokens' and the LM head 'lm_head'. "
        "Retrain with target_modules from those"
    )
