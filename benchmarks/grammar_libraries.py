"""xgrammar vs llguidance for structured outputs (issue 37 item 3): compile time, per-token mask time and JSON
schema coverage, on a base model's tokenizer. One JSON line per (library, tokenizer, schema), then a summary
line per (library, tokenizer).

    python benchmarks/grammar_libraries.py ~/.cache/lorahost/bench-smollm2-16/base [MORE_MODEL_DIRS...]
    python benchmarks/grammar_libraries.py --tiny          # the tests' generated tiny model

Per schema: `compile_ms` (a cold compile: no cache), `mask_us_per_token` (mask + advance for every token of a
valid instance, tokenized by the model's tokenizer), `accepts_valid` (the instance is accepted to the end and
the grammar can then stop), `rejects_invalid` (an instance that breaks the schema is refused somewhere): a
library "covers" a schema when all three hold. Both are used single-threaded, as the engine does per row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.grammar_schemas import SCHEMAS
from benchmarks.run_info import cpu_model


def _eos_id(model_dir: Path, tokenizer: Any) -> int:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return int(tokenizer.token_to_id(eos))


def _vocab_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


class Llguidance:
    """llguidance: LLTokenizer from tokenizer.json (no transformers, no torch), LLMatcher per row."""

    name = "llguidance"

    def __init__(self, model_dir: Path) -> None:
        import llguidance
        from tokenizers import Tokenizer

        self.llg = llguidance
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        started = time.perf_counter()
        self.tokenizer = llguidance.LLTokenizer(
            tok.to_str(), n_vocab=_vocab_size(model_dir), eos_token=_eos_id(model_dir, tok)
        )
        self.tokenizer_ms = (time.perf_counter() - started) * 1000
        self.num_mask_bytes = (_vocab_size(model_dir) + 31) // 32 * 4

    def compile(self, schema: dict) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        error = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise ValueError(error)
        return grammar

    def run(self, compiled: Any, tokens: list[int]) -> tuple[bool, float]:
        matcher = self.llg.LLMatcher(self.tokenizer, compiled, log_level=0)
        target = bytearray(self.num_mask_bytes)
        started = time.perf_counter()
        for token in tokens:
            matcher.unsafe_compute_mask_ptr(_address(target), len(target))
            if not matcher.consume_token(token):
                return False, 0.0
        elapsed = time.perf_counter() - started
        return matcher.is_accepting(), elapsed


class Xgrammar:
    """xgrammar: TokenizerInfo from the transformers tokenizer (imports torch), GrammarMatcher per row."""

    name = "xgrammar"

    def __init__(self, model_dir: Path) -> None:
        import xgrammar
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        self.xgr = xgrammar
        hf = AutoTokenizer.from_pretrained(str(model_dir))
        eos = _eos_id(model_dir, Tokenizer.from_file(str(model_dir / "tokenizer.json")))
        started = time.perf_counter()
        info = xgrammar.TokenizerInfo.from_huggingface(
            hf, vocab_size=_vocab_size(model_dir), stop_token_ids=[eos]
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.stop_token_id = eos
        self.tokenizer_ms = (time.perf_counter() - started) * 1000
        self.bitmask = xgrammar.allocate_token_bitmask(1, _vocab_size(model_dir))

    def compile(self, schema: dict) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), strict_mode=True)

    def run(self, compiled: Any, tokens: list[int]) -> tuple[bool, float]:
        matcher = self.xgr.GrammarMatcher(compiled)
        started = time.perf_counter()
        for token in tokens:
            matcher.fill_next_token_bitmask(self.bitmask)
            if not matcher.accept_token(token):
                return False, 0.0
        elapsed = time.perf_counter() - started
        # the grammar can end here: its stop token is allowed
        return matcher.accept_token(self.stop_token_id), elapsed


def _address(buffer: bytearray) -> int:
    import ctypes

    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))


def measure(lib: Any, tokenizer: Any, name: str, case: dict) -> dict:
    """One schema on one library: compile, accept the valid instance, refuse the invalid one."""
    row: dict[str, Any] = {"library": lib.name, "schema": name}
    started = time.perf_counter()
    try:
        compiled = lib.compile(case["schema"])
    except Exception as exc:  # noqa: BLE001 (a library's refusal is a coverage result, not a crash)
        return row | {"compiles": False, "error": str(exc)[:160]}
    row |= {"compiles": True, "compile_ms": round((time.perf_counter() - started) * 1000, 2)}
    valid = tokenizer.encode(json.dumps(case["valid"]), add_special_tokens=False).ids
    accepted, seconds = lib.run(compiled, valid)
    invalid = tokenizer.encode(json.dumps(case["invalid"]), add_special_tokens=False).ids
    refused = not lib.run(compiled, invalid)[0]
    row |= {"accepts_valid": accepted, "rejects_invalid": refused, "num_tokens": len(valid)}
    if accepted:
        row["mask_us_per_token"] = round(seconds * 1e6 / max(len(valid), 1), 1)
    row["covers"] = accepted and refused
    return row


def run_model(model_dir: Path, label: str) -> None:
    """Every library on every schema for one model's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    machine = {"cpu": cpu_model(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    for lib_class in (Llguidance, Xgrammar):
        lib = lib_class(model_dir)
        rows = [measure(lib, tokenizer, name, case) for name, case in SCHEMAS.items()]
        for row in rows:
            print(json.dumps({"tokenizer": label, **row}), flush=True)
        masks = sorted(r["mask_us_per_token"] for r in rows if "mask_us_per_token" in r)
        compiles = sorted(r["compile_ms"] for r in rows if "compile_ms" in r)
        summary = {
            "tokenizer": label,
            "library": lib.name,
            "summary": True,
            "tokenizer_setup_ms": round(lib.tokenizer_ms, 1),
            "num_schemas": len(rows),
            "num_covered": sum(bool(r.get("covers")) for r in rows),
            "not_covered": [r["schema"] for r in rows if not r.get("covers")],
            "compile_ms_median": compiles[len(compiles) // 2] if compiles else None,
            "compile_ms_max": compiles[-1] if compiles else None,
            "mask_us_per_token_median": masks[len(masks) // 2] if masks else None,
            "mask_us_per_token_max": masks[-1] if masks else None,
            **machine,
        }
        print(json.dumps(summary), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dirs", nargs="*", type=Path)
    parser.add_argument("--tiny", action="store_true", help="also the tests' generated tiny model")
    args = parser.parse_args(argv)
    for model_dir in args.model_dirs:
        run_model(model_dir.expanduser(), model_dir.expanduser().parent.name or str(model_dir))
    if args.tiny:
        from gpu_workers.engine.demo_model import generate_base_model

        with tempfile.TemporaryDirectory() as tmp:
            run_model(generate_base_model(Path(tmp) / "tiny", "tiny"), "tiny")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
