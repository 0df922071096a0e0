"""Builders of valid and malformed adapter uploads, shared by the validation and the HTTP upload tests.

Every case is `MalformedCase(case_id, build, expected_code)`; `build(tmp_dir)` writes the upload into
tmp_dir and returns the file paths to send: several plain files (multipart) or one archive. Adapters are
synthesised with numpy for `DEMO_SPEC`, the tiny demo base model (gpu_workers.demo_model SIZES["tiny"]).

- `MALFORMED_CASES` fail with `expected_code` under default `ValidationLimits()`.
- `TIGHT_LIMIT_CASES` fail with `expected_code` only under `TIGHT_LIMITS` (big files stay small in tests).
- `VALID_CASES` pass under both.
`validate_upload_files(files, work_dir, spec, limits)` is the reference pipeline the cases are checked with.
"""

from __future__ import annotations

import io
import json
import shutil
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

from registry.archive import extract_archive, is_archive_name
from registry.validation import (
    AdapterInfo,
    BaseModelSpec,
    ValidationLimits,
    check_upload_filenames,
    validate_adapter_dir,
)

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
TIGHT_LIMITS = ValidationLimits(
    max_rank=64, max_adapter_bytes=64 * 1024, max_uncompressed_bytes=256 * 1024, max_archive_members=8
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


def lora_tensors(
    spec: BaseModelSpec = DEMO_SPEC,
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Seeded float32 A [r, in] and B [out, r] for every layer and module."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for module in modules:
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


def _config_bytes(encoding: str, **overrides: Any) -> bytes:
    """A valid adapter_config.json in another encoding than UTF-8 (or with a BOM)."""
    return json.dumps(lora_config(**overrides), ensure_ascii=False).encode(encoding)


def _adapter(
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


def _valid_members(folder: str = "", **kwargs: Any) -> list[tuple[str, bytes]]:
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


def _zip_bomb(path: Path, num_mib: int) -> Files:
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


# ---------------------------------------------------------------------------------------------------------
# Reference pipeline


def validate_upload_files(
    files: Files, work_dir: Path, spec: BaseModelSpec = DEMO_SPEC, limits: ValidationLimits | None = None
) -> AdapterInfo:
    """One archive -> extract then validate; plain files -> check names, copy into a dir, validate."""
    limits = limits or ValidationLimits()
    adapter_dir = work_dir / "adapter"
    if len(files) == 1 and is_archive_name(files[0].name):
        extract_archive(files[0], adapter_dir, limits)
    else:
        check_upload_filenames([f.name for f in files])
        adapter_dir.mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, adapter_dir / f.name)
    return validate_adapter_dir(adapter_dir, spec, limits)


# ---------------------------------------------------------------------------------------------------------
# Cases


def _with_tensors(
    mutate: Callable[[dict[str, np.ndarray]], object],
    config: dict | None = None,
    dtype: str = "F32",
    **tensor_kwargs: Any,
) -> Callable[[Path], Files]:
    def build(tmp_dir: Path) -> Files:
        tensors = lora_tensors(**tensor_kwargs)
        mutate(tensors)
        return _adapter(tmp_dir, config, tensors, dtype)

    return build


def _with_config(**overrides: Any) -> Callable[[Path], Files]:
    return lambda tmp_dir: _adapter(tmp_dir, lora_config(**overrides))


def _with_weights(make: Callable[[], bytes]) -> Callable[[Path], Files]:
    return lambda tmp_dir: write_upload(tmp_dir, lora_config(), make())


def _set(name: str, value: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda tensors: tensors.__setitem__(name, value)


def _poison(value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(tensors: dict[str, np.ndarray]) -> None:
        tensors[tensor_name(1, "v_proj", "B")][3, 2] = value

    return mutate


def _fill(value: float, side: str = "") -> Callable[[dict[str, np.ndarray]], None]:
    """Set every value of every tensor (of one side "A"/"B", or all) to `value`."""

    def mutate(tensors: dict[str, np.ndarray]) -> None:
        for name, array in tensors.items():
            if f"lora_{side}" in name:
                array[...] = value

    return mutate


def _poison_a(value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(tensors: dict[str, np.ndarray]) -> None:
        tensors[tensor_name(0, "q_proj", "A")][1, 7] = -value

    return mutate


def _overlapping() -> bytes:
    a, b = tensor_name(0, "q_proj", "A"), tensor_name(0, "q_proj", "B")
    header = {
        a: {"dtype": "F32", "shape": [4, 64], "data_offsets": [0, 1024]},
        b: {"dtype": "F32", "shape": [64, 4], "data_offsets": [512, 1536]},
    }
    return raw_safetensors(header, b"\0" * 1536)


def _truncated() -> bytes:
    return safetensors_bytes(lora_tensors())[:-100]


def _bad_header_json() -> bytes:
    return raw_safetensors(b'{"base_model.model.model.layers.0": {"dtype": "F32", ', b"\0" * 64)


def _header_too_large() -> bytes:
    return struct.pack("<Q", 1 << 40) + b'{"a": 1}' + b"\0" * 64


def _pickle(tmp_dir: Path) -> Files:
    return write_upload(tmp_dir, lora_config(), None, {"adapter_model.bin": b"\x80\x04\x95 pickle bytes"})


def _extra_file(tmp_dir: Path) -> Files:
    return write_upload(tmp_dir, lora_config(), valid_files()[WEIGHTS], {"training_args.json": b"{}"})


def _tar_link(kind: bytes, name: str) -> Callable[[Path], Files]:
    def build(tmp_dir: Path) -> Files:
        link = tarfile.TarInfo(name)
        link.type = kind
        link.linkname = "/etc/passwd"
        return write_tar(tmp_dir / "adapter.tar.gz", [*_valid_members()[:1], link])

    return build


def _tar_device(tmp_dir: Path) -> Files:
    device = tarfile.TarInfo(WEIGHTS)
    device.type = tarfile.CHRTYPE
    device.devmajor, device.devminor = 1, 3
    return write_tar(tmp_dir / "adapter.tgz", [*_valid_members()[:1], device])


def _zip(
    members: Callable[[], list[tuple[str, bytes]]], symlinks: tuple[str, ...] = ()
) -> Callable[[Path], Files]:
    return lambda tmp_dir: write_zip(tmp_dir / "adapter.zip", members(), symlinks)


def _tar(members: Callable[[], list]) -> Callable[[Path], Files]:
    return lambda tmp_dir: write_tar(tmp_dir / "adapter.tar.gz", members())


def _wrong_base_model(tmp_dir: Path) -> Files:
    other = BaseModelSpec("llama", 128, 344, 2, 8, 4, 16, 512)
    return _adapter(tmp_dir, spec=other)


def _not_an_archive(tmp_dir: Path) -> Files:
    (tmp_dir / "adapter.zip").write_bytes(b"PK\x03\x04 this is not really a zip file" * 4)
    return [tmp_dir / "adapter.zip"]


def _oversize(tmp_dir: Path) -> Files:
    modules = ("q_proj", "k_proj", "v_proj", "o_proj")  # 2 layers at r=32: ~112 KiB > 64 KiB
    return _adapter(tmp_dir, lora_config(32, modules), rank=32, modules=modules)


Q_V = ("q_proj", "v_proj")
MALFORMED_CASES: list[MalformedCase] = [
    # file names
    MalformedCase("pickle_bin", _pickle, "pickle_not_allowed"),
    MalformedCase(
        "missing_config", lambda d: write_upload(d, None, valid_files()[WEIGHTS]), "missing_config"
    ),
    MalformedCase("missing_weights", lambda d: write_upload(d, lora_config(), None), "missing_weights"),
    MalformedCase("extra_file", _extra_file, "unexpected_file"),
    # adapter_config.json
    MalformedCase("config_not_json", lambda d: _adapter(d, b"{'r': 8,"), "config_not_json"),
    MalformedCase("config_not_object", lambda d: _adapter(d, b"[8, 16]"), "config_not_object"),
    # json.loads(bytes) guesses UTF-16/32 and skips a BOM: the platform takes exactly UTF-8 without one
    MalformedCase("config_utf16", lambda d: _adapter(d, _config_bytes("utf-16")), "config_not_utf8"),
    MalformedCase("config_utf16_be", lambda d: _adapter(d, _config_bytes("utf-16-be")), "config_not_utf8"),
    MalformedCase("config_utf32", lambda d: _adapter(d, _config_bytes("utf-32")), "config_not_utf8"),
    MalformedCase("config_utf8_bom", lambda d: _adapter(d, _config_bytes("utf-8-sig")), "config_not_utf8"),
    MalformedCase(
        "config_latin1", lambda d: _adapter(d, _config_bytes("latin-1", notes="café")), "config_not_utf8"
    ),
    MalformedCase("peft_prefix_tuning", _with_config(peft_type="PREFIX_TUNING"), "unsupported_peft_type"),
    MalformedCase("peft_ia3", _with_config(peft_type="IA3"), "unsupported_peft_type"),
    MalformedCase("dora", _with_config(use_dora=True), "dora_not_supported"),
    MalformedCase(
        "modules_to_save", _with_config(modules_to_save=["lm_head"]), "modules_to_save_not_supported"
    ),
    MalformedCase("lora_bias", _with_config(bias="lora_only"), "lora_bias_not_supported"),
    MalformedCase("rank_pattern", _with_config(rank_pattern={"q_proj": 8}), "rank_pattern_not_supported"),
    MalformedCase("alpha_pattern", _with_config(alpha_pattern={"v_proj": 32}), "rank_pattern_not_supported"),
    MalformedCase(
        "config_targets_lm_head", _with_config(modules=("q_proj", "lm_head")), "unsupported_target_module"
    ),
    MalformedCase("target_modules_regex", _with_config(target_modules=".*proj"), "unsupported_target_module"),
    MalformedCase("rank_zero", _with_config(r=0), "invalid_rank"),
    MalformedCase("rank_not_int", _with_config(r=4.5), "invalid_rank"),
    MalformedCase("rank_over_max", _with_config(r=257), "rank_too_large"),
    MalformedCase("alpha_zero", _with_config(lora_alpha=0), "invalid_alpha"),
    MalformedCase("alpha_negative", _with_config(lora_alpha=-8), "invalid_alpha"),
    MalformedCase("rslora_not_bool", _with_config(use_rslora="yes"), "invalid_config_value"),
    MalformedCase("alpha_over_max", _with_config(lora_alpha=20000), "alpha_too_large"),
    MalformedCase("scale_over_max", _with_config(lora_alpha=8192), "scale_too_large"),  # 8192 / r=4
    MalformedCase("rslora_scale_over_max", _with_config(lora_alpha=4096, use_rslora=True), "scale_too_large"),
    MalformedCase("task_type_seq_cls", _with_config(task_type="SEQ_CLS"), "unsupported_task_type"),
    MalformedCase("task_type_seq2seq", _with_config(task_type="SEQ_2_SEQ_LM"), "unsupported_task_type"),
    MalformedCase(
        "layers_to_transform_excludes_a_layer_with_weights",
        _with_config(layers_to_transform=[0]),
        "module_not_targeted",
    ),
    MalformedCase(
        "layers_to_transform_not_ints", _with_config(layers_to_transform="0"), "invalid_config_value"
    ),
    MalformedCase("layers_to_transform_empty", _with_config(layers_to_transform=[]), "invalid_config_value"),
    MalformedCase(
        "layers_pattern_of_another_model",
        _with_config(layers_to_transform=[0, 1], layers_pattern="h"),
        "unsupported_layers_pattern",
    ),
    MalformedCase(
        "layers_pattern_without_layers_to_transform",
        _with_config(layers_pattern="layers"),
        "invalid_config_value",
    ),
    MalformedCase(
        "exclude_modules_regex", _with_config(exclude_modules=".*q_proj"), "unsupported_config_option"
    ),
    MalformedCase(
        "excluded_module_has_weights",
        _with_config(exclude_modules=["model.layers.1.self_attn.v_proj"]),
        "module_not_targeted",
    ),
    # tensor names and shapes
    MalformedCase(
        "lm_head_tensors",
        _with_tensors(_set("base_model.model.lm_head.lora_A.weight", np.zeros((4, 64), np.float32))),
        "unsupported_target_module",
    ),
    MalformedCase(
        "embed_tokens_tensors",
        _with_tensors(
            _set("base_model.model.model.embed_tokens.lora_embedding_A", np.zeros((4, 512), np.float32))
        ),
        "unsupported_target_module",
    ),
    MalformedCase(
        "unexpected_tensor_name",
        _with_tensors(_set("optimizer.step", np.zeros((1,), np.float32))),
        "unexpected_tensor",
    ),
    MalformedCase(
        "module_not_targeted",
        _with_tensors(lambda t: None, lora_config(modules=("q_proj",))),
        "module_not_targeted",
    ),
    MalformedCase(
        "targeted_module_without_weights",
        _with_tensors(lambda t: None, modules=("q_proj",)),
        "missing_lora_weights",
    ),
    MalformedCase(
        "transposed_lora_A",
        _with_tensors(_set(tensor_name(0, "q_proj", "A"), np.zeros((64, 4), np.float32))),
        "invalid_tensor_shape",
    ),
    MalformedCase(
        "three_dim_tensor",
        _with_tensors(_set(tensor_name(0, "q_proj", "A"), np.zeros((1, 4, 64), np.float32))),
        "invalid_tensor_shape",
    ),
    MalformedCase("rank_mismatch", _with_tensors(lambda t: None, lora_config(rank=8)), "rank_mismatch"),
    MalformedCase("wrong_base_model", _wrong_base_model, "wrong_base_model"),
    MalformedCase(
        "layer_out_of_range",
        _with_tensors(_set(tensor_name(2, "q_proj", "A"), np.zeros((4, 64), np.float32))),
        "layer_out_of_range",
    ),
    MalformedCase(
        "lora_A_without_B", _with_tensors(lambda t: t.pop(tensor_name(1, "v_proj", "B"))), "missing_lora_pair"
    ),
    MalformedCase(
        "lora_B_without_A", _with_tensors(lambda t: t.pop(tensor_name(0, "q_proj", "A"))), "missing_lora_pair"
    ),
    # dtypes and values
    MalformedCase("int_dtype", lambda d: _adapter(d, dtype="I32"), "unsupported_dtype"),
    MalformedCase("f64_dtype", lambda d: _adapter(d, dtype="F64"), "unsupported_dtype"),
    MalformedCase("nan_value", _with_tensors(_poison(float("nan"))), "non_finite_values"),
    MalformedCase("inf_value", _with_tensors(_poison(float("inf"))), "non_finite_values"),
    MalformedCase("bf16_inf_value", _with_tensors(_poison(float("-inf")), dtype="BF16"), "non_finite_values"),
    MalformedCase("f16_overflow_inf", _with_tensors(_poison(1e6), dtype="F16"), "non_finite_values"),
    MalformedCase("every_value_3e38", _with_tensors(_fill(3e38)), "weights_too_large"),
    MalformedCase("bf16_every_value_3e38", _with_tensors(_fill(3e38), dtype="BF16"), "weights_too_large"),
    MalformedCase("one_huge_lora_A_value", _with_tensors(_poison_a(300.0)), "weights_too_large"),
    MalformedCase(  # 200 is a plausible stored value, but times the scale 2 the engine would hold 400
        "scaled_lora_B_over_max", _with_tensors(_fill(200.0, "B"), dtype="F16"), "weights_too_large"
    ),
    # the safetensors container
    MalformedCase("empty_weights", _with_weights(lambda: b""), "empty_weights"),
    MalformedCase(
        "no_tensors", _with_weights(lambda: raw_safetensors({"__metadata__": {}}, b"")), "empty_weights"
    ),
    MalformedCase("truncated_weights", _with_weights(_truncated), "truncated_weights"),
    MalformedCase("bad_header_json", _with_weights(_bad_header_json), "invalid_header"),
    MalformedCase("header_length_too_big", _with_weights(_header_too_large), "header_too_large"),
    MalformedCase("overlapping_offsets", _with_weights(_overlapping), "overlapping_tensors"),
    MalformedCase(
        "pickle_renamed_safetensors",
        _with_weights(lambda: b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}q\x00X\x06\x00\x00\x00weightq"),
        "header_too_large",
    ),
    # archives
    MalformedCase(
        "zip_parent_dir", _zip(lambda: [("../" + n, c) for n, c in _valid_members()]), "unsafe_archive_path"
    ),
    MalformedCase("tar_absolute_path", _tar(lambda: _valid_members("/tmp/adapter/")), "unsafe_archive_path"),
    MalformedCase("tar_symlink", _tar_link(tarfile.SYMTYPE, WEIGHTS), "archive_link_not_allowed"),
    MalformedCase("tar_hardlink", _tar_link(tarfile.LNKTYPE, WEIGHTS), "archive_link_not_allowed"),
    MalformedCase("zip_symlink", _zip(_valid_members, symlinks=(WEIGHTS,)), "archive_link_not_allowed"),
    MalformedCase("tar_device", _tar_device, "unsupported_archive_member"),
    MalformedCase("zip_bomb", lambda d: _zip_bomb(d / "adapter.zip", 1100), "archive_too_large"),
    MalformedCase(
        "zip_too_many_members",
        _zip(lambda: [*_valid_members(), *[(f"README{i}.md", b"") for i in range(8)]]),
        "too_many_archive_members",
    ),
    MalformedCase(
        "zip_duplicate_names", _zip(lambda: [*_valid_members(), _valid_members()[0]]), "duplicate_file"
    ),
    MalformedCase(
        "zip_extra_file", _zip(lambda: [*_valid_members(), ("notes.txt", b"hi")]), "unexpected_file"
    ),
    MalformedCase(
        "zip_pickle",
        _zip(lambda: [_valid_members()[0], ("adapter_model.bin", b"\x80\x04")]),
        "pickle_not_allowed",
    ),
    MalformedCase("zip_nested_folders", _zip(lambda: _valid_members("a/b/")), "invalid_archive_layout"),
    MalformedCase(
        "zip_two_folders",
        _zip(
            lambda: (
                [("a/" + n, c) for n, c in _valid_members()[:1]]
                + [("b/" + n, c) for n, c in _valid_members()[1:]]
            )
        ),
        "invalid_archive_layout",
    ),
    MalformedCase("zip_missing_weights", _zip(lambda: _valid_members()[:1]), "missing_weights"),
    MalformedCase("not_an_archive", _not_an_archive, "corrupt_archive"),
    MalformedCase(
        "tgz_bad_weights_inside", _tar(lambda: [_valid_members()[0], (WEIGHTS, b"")]), "empty_weights"
    ),
]

TIGHT_LIMIT_CASES: list[MalformedCase] = [
    MalformedCase("oversize_weights", _oversize, "weights_too_large"),
    MalformedCase(
        "rank_over_tight_max",
        lambda d: _adapter(d, lora_config(rank=128), rank=128, modules=Q_V),
        "rank_too_large",
    ),
    MalformedCase(
        "tar_bomb", _tar(lambda: [_valid_members()[0], (WEIGHTS, b"\0" * (1 << 20))]), "archive_too_large"
    ),
    MalformedCase("zip_bomb_small", lambda d: _zip_bomb(d / "adapter.zip", 1), "archive_too_large"),
]

VALID_CASES: list[MalformedCase] = [
    MalformedCase("valid_files", lambda d: write_upload(d, lora_config(), valid_files()[WEIGHTS]), ""),
    MalformedCase(
        "valid_with_readme",
        lambda d: write_upload(d, lora_config(), valid_files()[WEIGHTS], {"README.md": b"# my adapter"}),
        "",
    ),
    MalformedCase("valid_bf16", lambda d: _adapter(d, dtype="BF16"), ""),
    MalformedCase("valid_f16", lambda d: _adapter(d, dtype="F16"), ""),
    MalformedCase("valid_zip_flat", _zip(_valid_members), ""),
    MalformedCase(
        "valid_zip_in_folder", _zip(lambda: [("my-adapter/", b""), *_valid_members("my-adapter/")]), ""
    ),
    MalformedCase(
        "valid_tgz_in_folder",
        _tar(lambda: [*_valid_members("my-adapter/"), ("my-adapter/README.md", b"hi")]),
        "",
    ),
    MalformedCase(
        "valid_zip_with_macos_junk",
        _zip(
            lambda: [
                *_valid_members("a/"),
                ("__MACOSX/a/._adapter_config.json", b"junk"),
                ("a/.DS_Store", b"junk"),
            ]
        ),
        "",
    ),
]
