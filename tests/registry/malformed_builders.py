"""Builders of the upload cases in tests/registry/malformed.py: each returns `build(tmp_dir) -> Files` (or a
tensor mutation one of them applies)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from registry.validation import (
    BaseModelSpec,
)
from tests.registry.upload_builders import (
    VOCAB_MODULES,
    WEIGHTS,
    Files,
    adapter_upload,
    add_magnitudes,
    lora_config,
    lora_tensors,
    magnitude_name,
    raw_safetensors,
    safetensors_bytes,
    tensor_name,
    valid_files,
    write_upload,
)


def with_tensors(
    mutate: Callable[[dict[str, np.ndarray]], object],
    config: dict | None = None,
    dtype: str = "F32",
    **tensor_kwargs: Any,
) -> Callable[[Path], Files]:
    def build(tmp_dir: Path) -> Files:
        tensors = lora_tensors(**tensor_kwargs)
        mutate(tensors)
        return adapter_upload(tmp_dir, config, tensors, dtype)

    return build


def with_config(**overrides: Any) -> Callable[[Path], Files]:
    return lambda tmp_dir: adapter_upload(tmp_dir, lora_config(**overrides))


def with_weights(make: Callable[[], bytes]) -> Callable[[Path], Files]:
    return lambda tmp_dir: write_upload(tmp_dir, lora_config(), make())


def set(name: str, value: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda tensors: tensors.__setitem__(name, value)


def poison(value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(tensors: dict[str, np.ndarray]) -> None:
        tensors[tensor_name(1, "v_proj", "B")][3, 2] = value

    return mutate


def fill(value: float, side: str = "") -> Callable[[dict[str, np.ndarray]], None]:
    """Set every value of every tensor (of one side "A"/"B", or all) to `value`."""

    def mutate(tensors: dict[str, np.ndarray]) -> None:
        for name, array in tensors.items():
            if f"lora_{side}" in name:
                array[...] = value

    return mutate


def dora(then: Callable[[dict[str, np.ndarray]], None]) -> Callable[[dict[str, np.ndarray]], None]:
    """Add DoRA magnitude vectors, then apply `then`."""

    def mutate(tensors: dict[str, np.ndarray]) -> None:
        then(add_magnitudes(tensors))

    return mutate


def vocab(mutate: Callable[[dict[str, np.ndarray]], object]) -> Callable[[Path], Files]:
    """An adapter on q_proj, v_proj, embed_tokens and lm_head (VOCAB_MODULES), then `mutate`d."""
    return with_tensors(mutate, lora_config(modules=VOCAB_MODULES), modules=VOCAB_MODULES)


def poison_magnitude(value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(tensors: dict[str, np.ndarray]) -> None:
        tensors[magnitude_name(0, "q_proj")][5] = value

    return mutate


def poison_a(value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(tensors: dict[str, np.ndarray]) -> None:
        tensors[tensor_name(0, "q_proj", "A")][1, 7] = -value

    return mutate


def overlapping() -> bytes:
    a, b = tensor_name(0, "q_proj", "A"), tensor_name(0, "q_proj", "B")
    header = {
        a: {"dtype": "F32", "shape": [4, 64], "data_offsets": [0, 1024]},
        b: {"dtype": "F32", "shape": [64, 4], "data_offsets": [512, 1536]},
    }
    return raw_safetensors(header, b"\0" * 1536)


def truncated() -> bytes:
    return safetensors_bytes(lora_tensors())[:-100]


def bad_header_json() -> bytes:
    return raw_safetensors(b'{"base_model.model.model.layers.0": {"dtype": "F32", ', b"\0" * 64)


def header_too_large() -> bytes:
    return struct.pack("<Q", 1 << 40) + b'{"a": 1}' + b"\0" * 64


def pickle(tmp_dir: Path) -> Files:
    return write_upload(tmp_dir, lora_config(), None, {"adapter_model.bin": b"\x80\x04\x95 pickle bytes"})


def extra_file(tmp_dir: Path) -> Files:
    return write_upload(tmp_dir, lora_config(), valid_files()[WEIGHTS], {"training_args.json": b"{}"})


def wrong_base_model(tmp_dir: Path) -> Files:
    other = BaseModelSpec("llama", 128, 344, 2, 8, 4, 16, 512)
    return adapter_upload(tmp_dir, spec=other)


def oversize(tmp_dir: Path) -> Files:
    modules = ("q_proj", "k_proj", "v_proj", "o_proj")  # 2 layers at r=32: ~112 KiB > 64 KiB
    return adapter_upload(tmp_dir, lora_config(32, modules), rank=32, modules=modules)
