"""Builders of adapter uploads, valid or not, shared by the validation, archive and HTTP upload tests: PEFT
configs, safetensors files (any dtype, hand-written headers), plain-file uploads and archives (zip, tar,
hand-built zips whose headers lie). Adapters are synthesised with numpy for `DEMO_SPEC`, the tiny demo base
model (gpu_workers.engine.demo_model SIZES["tiny"]). A `MalformedCase` pairs an upload with the refusal it expects.
"""

from __future__ import annotations

import io
import json
import stat
import struct
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from registry.validation import BaseModelSpec

DEMO_SPEC = BaseModelSpec(
    model_type="llama",
    hidden_size=64,
    intermediate_size=176,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    vocab_size=512,
)
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model.model.layers"
_PARENT = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}

# peft's saved names of the LoRA on the token embedding and the LM head (module -> (A, B))
VOCAB_TENSOR_NAMES = {
    "embed_tokens": (
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "base_model.model.model.embed_tokens.lora_embedding_B",
    ),
    "lm_head": ("base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"),
}
VOCAB_MODULES = ("q_proj", "v_proj", "embed_tokens", "lm_head")  # an adapter with both vocab targets

Files = list[Path]


class MalformedCase(NamedTuple):
    """One upload and the AdapterValidationError.code it must be refused with ("" for valid cases)."""

    case_id: str
    build: Callable[[Path], Files]
    expected_code: str


# ---------------------------------------------------------------------------------------------------------
# Writing adapters


def tensor_name(layer: int, module: str, side: str) -> str:
    """PEFT's saved name of one LoRA matrix."""
    return f"{PREFIX}.{layer}.{_PARENT[module]}.{module}.lora_{side}.weight"


def magnitude_name(layer: int, module: str) -> str:
    """PEFT's saved name of one DoRA magnitude vector ([out_features])."""
    return f"{PREFIX}.{layer}.{_PARENT[module]}.{module}.lora_magnitude_vector"


def add_magnitudes(tensors: dict[str, np.ndarray], spec: BaseModelSpec = DEMO_SPEC) -> dict[str, np.ndarray]:
    """`tensors` plus a positive DoRA magnitude vector for every (layer, module) that has a lora_A."""
    rng = np.random.default_rng(1)
    for name in [n for n in tensors if n.endswith(".lora_A.weight")]:
        parts = name.split(".")
        layer, module = int(parts[-5]), parts[-3]
        out_features = spec.module_shape(module)[1]
        tensors[magnitude_name(layer, module)] = rng.uniform(0.5, 2.0, out_features).astype(np.float32)
    return tensors


def lora_config(rank: int = 4, modules: tuple[str, ...] = ("q_proj", "v_proj"), **overrides: Any) -> dict:
    """A PEFT LoraConfig dict as save_pretrained writes it (the fields validation looks at)."""
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(modules),
        "bias": "none",
        "use_dora": False,
        "use_rslora": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "base_model_name_or_path": "base",
    }
    config.update(overrides)
    return config


def config_json(**overrides: Any) -> bytes:
    """lora_config(**overrides) as adapter_config.json bytes."""
    return json.dumps(lora_config(**overrides)).encode()


def lora_tensors(
    spec: BaseModelSpec = DEMO_SPEC,
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Seeded float32 A [r, in] and B [out, r] for every layer and module (once for embed_tokens / lm_head:
    lora_embedding_A [r, vocab] and lora_embedding_B [hidden, r]; lm_head lora_A [r, hidden], lora_B [vocab, r])."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for module in (m for m in modules if m in VOCAB_TENSOR_NAMES):
        in_features, out_features = spec.module_shape(module)
        a_name, b_name = VOCAB_TENSOR_NAMES[module]
        tensors[a_name] = rng.standard_normal((rank, in_features), np.float32)
        tensors[b_name] = rng.standard_normal((out_features, rank), np.float32)
    for layer in range(spec.num_layers):
        for module in (m for m in modules if m not in VOCAB_TENSOR_NAMES):
            in_features, out_features = spec.module_shape(module)
            tensors[tensor_name(layer, module, "A")] = rng.standard_normal((rank, in_features), np.float32)
            tensors[tensor_name(layer, module, "B")] = rng.standard_normal((out_features, rank), np.float32)
    return tensors


def _encode(array: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return (np.ascontiguousarray(array, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
    numpy_dtype = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I8": "i1"}[dtype]
    with np.errstate(over="ignore", invalid="ignore"):  # float16 overflow to inf is wanted in some cases
        return np.ascontiguousarray(array, dtype=numpy_dtype).tobytes()


def safetensors_bytes(
    tensors: dict[str, np.ndarray], dtype: str = "F32", dtypes: dict | None = None
) -> bytes:
    """Encode tensors as a safetensors file (header padded to 8 bytes, as the safetensors library does)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in tensors.items():
        tensor_dtype = (dtypes or {}).get(name, dtype)
        blob = _encode(array, tensor_dtype)
        header[name] = {
            "dtype": tensor_dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    return raw_safetensors(header, b"".join(blobs))


def raw_safetensors(header: dict | bytes, data: bytes) -> bytes:
    """A safetensors file from a header (dict or raw bytes, used as given) and a data buffer."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    if not isinstance(header, bytes):
        header_bytes += b" " * (-len(header_bytes) % 8)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + data


def write_upload(
    tmp_dir: Path, config: dict | bytes | None, weights: bytes | None, extra: dict | None = None
) -> Files:
    """Write the given files into tmp_dir/upload; returns their paths (config first)."""
    upload = tmp_dir / "upload"
    upload.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    if config is not None:
        files[CONFIG] = config if isinstance(config, bytes) else json.dumps(config, indent=2).encode()
    if weights is not None:
        files[WEIGHTS] = weights
    files.update(extra or {})
    paths = []
    for name, content in files.items():
        (upload / name).write_bytes(content)
        paths.append(upload / name)
    return paths


def valid_files(
    spec: BaseModelSpec = DEMO_SPEC,
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    dtype: str = "F32",
) -> dict[str, bytes]:
    """name -> content of a valid adapter."""
    config = lora_config(rank, modules)
    weights = safetensors_bytes(lora_tensors(spec, rank, modules), dtype)
    return {CONFIG: json.dumps(config, indent=2).encode(), WEIGHTS: weights}


def config_bytes(encoding: str, **overrides: Any) -> bytes:
    """A valid adapter_config.json in another encoding than UTF-8 (or with a BOM)."""
    return json.dumps(lora_config(**overrides), ensure_ascii=False).encode(encoding)


def adapter_upload(
    tmp_dir: Path,
    config: dict | bytes | None = None,
    tensors: dict | None = None,
    dtype: str = "F32",
    **tensor_kwargs: Any,
) -> Files:
    config = lora_config() if config is None else config
    weights = safetensors_bytes(tensors if tensors is not None else lora_tensors(**tensor_kwargs), dtype)
    return write_upload(tmp_dir, config, weights)


# ---------------------------------------------------------------------------------------------------------
# Writing archives


def write_zip(path: Path, members: list[tuple[str, bytes]], symlinks: tuple[str, ...] = ()) -> Files:
    """A zip of (name, content) members, names used as given; names in `symlinks` become symlinks."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are written on purpose
        for name, content in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = (stat.S_IFLNK | 0o777) if name in symlinks else (stat.S_IFREG | 0o644)
            mode = (stat.S_IFDIR | 0o755) if name.endswith("/") else mode
            info.external_attr = mode << 16
            archive.writestr(info, content)
    return [path]


def write_tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Files:
    """A .tar.gz of (name, content) regular files and/or prepared TarInfo entries (links, devices)."""
    with tarfile.open(path, "w:gz") as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                archive.addfile(info, io.BytesIO(member[1]))
    return [path]


def valid_members(folder: str = "", **kwargs: Any) -> list[tuple[str, bytes]]:
    return [(folder + name, content) for name, content in valid_files(**kwargs).items()]


def write_raw_zip(path: Path, members: list[tuple[bytes, bytes, int, int | None]]) -> None:
    """A hand-built zip of (name, payload, method 0=stored/8=deflated, declared size or None = honest).

    Lets tests write headers that lie about sizes (zip bombs), which zipfile refuses to produce.
    """
    local, central = b"", b""
    for name, payload, method, declared in members:
        size = len(payload) if declared is None else declared
        crc = zlib.crc32(payload) if method == 0 else 0
        fields = struct.pack("<HHHHHIIIHH", 20, 0, method, 0, 0x21, crc, len(payload), size, len(name), 0)
        central += (
            b"PK\x01\x02"
            + struct.pack("<H", 20)
            + fields
            + struct.pack("<HHHII", 0, 0, 0, 0, len(local))
            + name
        )
        local += b"PK\x03\x04" + fields + name + payload
    end = b"PK\x05\x06" + struct.pack(
        "<HHHHIIH", 0, 0, len(members), len(members), len(central), len(local), 0
    )
    path.write_bytes(local + central + end)


def zip_bomb(path: Path, num_mib: int) -> Files:
    """A hand-written zip whose weights member inflates to num_mib MiB of zeros from ~1 KiB per MiB.

    Deflate output after a full flush is byte-identical for identical input, so one compressed MiB is
    repeated. Sizes in the headers are honest; the CRC is not computed (the archive is refused before).
    """
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(b"\0" * (1 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)
    data = block * num_mib + compressor.flush()
    members = [
        (CONFIG.encode(), 0, json.dumps(lora_config()).encode(), 0),
        (WEIGHTS.encode(), 8, data, num_mib << 20),
    ]
    write_raw_zip(path, [(name, payload, method, size or None) for name, method, payload, size in members])
    return [path]
