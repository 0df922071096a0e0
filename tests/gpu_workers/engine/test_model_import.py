"""`lorahost import-model`: HF directories and GGUF files in, an HF safetensors directory out (or nothing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from gpu_workers.engine import model_import
from gpu_workers.engine.model_import import ModelImportError, import_model, supported_gguf_tensor_types
from lorahost.cli import app


def _write_gguf(path: Path, architecture: str, tensor_type: str = "F32") -> Path:
    """A minimal GGUF file: the architecture key and one tensor of the given type (no tokenizer)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    qtype = gguf.GGMLQuantizationType[tensor_type]
    if tensor_type == "F32":
        writer.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    else:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.zeros((4, 32 // block_size * type_size), dtype=np.uint8)
        writer.add_tensor("token_embd.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".import-" in p.name)


def test_imports_hf_directory_with_identical_weights(base_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "imported"
    result = import_model(base_model_dir, out)
    assert result.source_format == "hf" and result.model_type == "llama"
    original = load_file(str(next(base_model_dir.glob("*.safetensors"))))
    converted = load_file(str(out / "model.safetensors"))
    assert set(converted) <= set(original)
    for name, tensor in converted.items():
        assert torch.equal(tensor, original[name]), name
    assert (out / "tokenizer.json").is_file()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert _leftovers(tmp_path) == []


def test_imported_directory_serves_the_same_tokens(base_model_dir: Path, tmp_path: Path) -> None:
    from gpu_workers.engine.config import EngineConfig
    from gpu_workers.engine.llm_engine import LLMEngine
    from scheduler.core.sampling import SamplingParams

    out = tmp_path / "imported"
    import_model(base_model_dir, out, dtype="float32")
    outputs = []
    for model_dir in (base_model_dir, out):
        engine = LLMEngine(EngineConfig(model_path=model_dir, dtype="float32", num_kv_blocks=32))
        ids = engine.tokenizer.encode("hello world the river")
        outputs.append(engine.generate([ids], SamplingParams(max_tokens=8, temperature=0.0))[0].token_ids)
    assert outputs[0] == outputs[1]


def test_refuses_unsupported_hf_architecture_and_writes_nothing(base_model_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "gpt2"
    shutil.copytree(base_model_dir, src)
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelImportError) as err:
        import_model(src, tmp_path / "out")
    assert err.value.code == "unsupported_architecture"
    assert "GPT2LMHeadModel" in err.value.message
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_refuses_hf_directory_without_weights(base_model_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "noweights"
    src.mkdir()
    shutil.copy(base_model_dir / "config.json", src / "config.json")
    with pytest.raises(ModelImportError) as err:
        import_model(src, tmp_path / "out")
    assert err.value.code == "missing_weights"


def test_refuses_gguf_of_unsupported_architecture(tmp_path: Path) -> None:
    src = _write_gguf(tmp_path / "m.gguf", "gpt2")
    with pytest.raises(ModelImportError) as err:
        import_model(src, tmp_path / "out")
    assert err.value.code == "unsupported_architecture"
    assert "gpt2" in err.value.message
    assert not (tmp_path / "out").exists()


def test_refuses_gguf_with_a_tensor_type_that_cannot_be_dequantized(tmp_path: Path) -> None:
    assert "Q8_1" not in supported_gguf_tensor_types()
    src = _write_gguf(tmp_path / "m.gguf", "llama", tensor_type="Q8_1")
    with pytest.raises(ModelImportError) as err:
        import_model(src, tmp_path / "out")
    assert err.value.code == "unsupported_quantization"
    assert "Q8_1" in err.value.message


def test_common_gguf_quantizations_are_supported() -> None:
    assert {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"} <= supported_gguf_tensor_types()


def test_refuses_truncated_gguf(tmp_path: Path) -> None:
    full = _write_gguf(tmp_path / "full.gguf", "llama")
    src = tmp_path / "cut.gguf"
    src.write_bytes(full.read_bytes()[:40])
    with pytest.raises(ModelImportError) as err:
        import_model(src, tmp_path / "out")
    assert err.value.code == "corrupt_file"


def test_refuses_file_that_is_not_gguf(tmp_path: Path) -> None:
    src = tmp_path / "model.safetensors"
    src.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ModelImportError) as err:
        import_model(src, tmp_path / "out")
    assert err.value.code == "unsupported_format"


def test_refuses_non_empty_out_dir_and_keeps_its_files(base_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ModelImportError) as err:
        import_model(base_model_dir, out)
    assert err.value.code == "out_dir_not_empty"
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_failure_after_writing_leaves_nothing(
    base_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_args: object) -> None:
        raise ModelImportError("corrupt_file", "simulated failure after the files were written")

    monkeypatch.setattr(model_import, "_check_output", fail)
    with pytest.raises(ModelImportError):
        import_model(base_model_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert _leftovers(tmp_path) == []


def test_cli_reports_refusal_with_exit_code(tmp_path: Path) -> None:
    src = _write_gguf(tmp_path / "m.gguf", "falcon")
    result = CliRunner().invoke(app, ["import-model", str(src), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "falcon" in result.output
    assert not (tmp_path / "out").exists()


def test_cli_imports_hf_directory(base_model_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["import-model", str(base_model_dir), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "serve --base-model" in result.output
    assert (tmp_path / "out" / "config.json").is_file()
