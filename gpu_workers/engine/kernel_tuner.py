"""Kernels chosen by measurement, per machine: time the candidate implementations of an op on the model's own
shapes, keep the fastest (the simplest on a near tie), and cache the choice so later starts cost nothing.

The cache (a JSON file, default ~/.cache/lorahost/kernel_choices.json; `LORAHOST_ENGINE_KERNEL_CHOICES_PATH`)
is keyed by the CPU model, a digest of its flags, the torch version, the thread count, the dtype and the op's
shape (and, for an op measured on a GPU, the GPU's name, CUDA and triton versions): a later start with the same
key never re-measures, so a busy machine at start cannot flip a choice.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CACHE_PATH_ENV = "LORAHOST_ENGINE_KERNEL_CHOICES_PATH"
DEFAULT_NUM_REPEATS = 5
DEFAULT_MARGIN = 1.15  # the simplest candidate is kept unless another is this much faster
_CACHE_VERSION = 1


@dataclass(frozen=True)
class KernelChoice:
    """The implementation chosen for one op; `timings`: best seconds per candidate when measured now (empty
    when the choice came from the cache or was forced); `source`: "measured", "cached", "forced" or "only" (the
    one usable candidate here); `skipped`: the op's forms that were no candidates here, each with why."""

    op: str
    choice: str
    timings: dict[str, float] = field(default_factory=dict)
    source: str = "measured"
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unusable:
    """A candidate that turned out unable to run while it was built (e.g. its compile outran its budget): `choose`
    measures the others and keeps this reason in the choice's `skipped` (and in the cache)."""

    reason: str


def pick_candidate(timings: Mapping[str, float], margin: float = DEFAULT_MARGIN) -> str:
    """The fastest candidate, unless the simplest (the first) is within `margin` of it: then the simplest."""
    if not timings:
        raise ValueError("pick_candidate needs at least one timing")
    simplest = next(iter(timings))
    fastest = min(timings, key=lambda name: timings[name])
    return simplest if timings[simplest] <= timings[fastest] * margin else fastest


def default_cache_path() -> Path:
    """$LORAHOST_ENGINE_KERNEL_CHOICES_PATH, else ~/.cache/lorahost/kernel_choices.json."""
    configured = os.environ.get(CACHE_PATH_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "lorahost" / "kernel_choices.json"


def machine_fingerprint() -> dict[str, str]:
    """What a choice depends on besides the op: CPU model, CPU flags digest, torch version, thread count, and
    the instruction sets torch and oneDNN may use (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA cap them below the
    CPU's flags)."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and ":" in line and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return {
        "cpu": model,
        "flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "isa": f"{torch.backends.cpu.get_cpu_capability()}/{os.environ.get('ONEDNN_MAX_CPU_ISA', '')}",
    }


def _wait_for_device() -> None:
    """Wait for queued CUDA work (a launch returns before its kernel ends); nothing where CUDA is unused."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def accelerator_fingerprint(device: torch.device | None) -> dict[str, str]:
    """What a choice measured on a GPU depends on besides the host: the GPU's name, CUDA and triton versions
    (nothing for a CPU device, so CPU choices keep their keys)."""
    if device is None or device.type != "cuda":
        return {}
    try:
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = ""
    return {
        "gpu": torch.cuda.get_device_name(device),
        "cuda": str(torch.version.cuda),
        "triton": triton_version,
    }


class KernelTuner:
    """Chooses among named candidate callables of an op (see `choose`); `seconds` is the time spent measuring."""

    def __init__(
        self,
        cache_path: Path | None = None,
        *,
        num_repeats: int = DEFAULT_NUM_REPEATS,
        margin: float = DEFAULT_MARGIN,
        clock: Callable[[], float] = time.perf_counter,
        machine: Mapping[str, str] | None = None,
        is_reusing_cache: bool = True,
    ) -> None:
        if num_repeats < 1:
            raise ValueError(f"num_repeats must be >= 1, got {num_repeats}")
        self.cache_path = Path(cache_path) if cache_path else default_cache_path()
        self.num_repeats = num_repeats
        self.margin = margin
        self.clock = clock
        self.machine = dict(machine) if machine is not None else machine_fingerprint()
        self.is_reusing_cache = is_reusing_cache  # False: measure again (and overwrite the cached choices)
        self.seconds = 0.0
        self.choices: dict[str, KernelChoice] = {}
        self._cache: dict[str, dict] | None = None

    def choose(
        self,
        op: str,
        names: Sequence[str],
        build: Callable[[], Mapping[str, Callable[[], object] | Unusable]],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        forced: str | None = None,
        *,
        skipped: Mapping[str, str] | None = None,
    ) -> KernelChoice:
        """The candidate to use for `op` among `names` (the simplest first): `forced` when given, else the
        cached choice for this machine/dtype/shape, else measured now on `build()` (name -> callable; built
        only when measuring; a candidate built as `Unusable` is not measured) and cached. `skipped`: the op's forms
        that cannot run here, with why (kept on the choice). On a GPU the caller adds `accelerator_fingerprint` to
        `machine` (kernel_plan.plan_kernels)."""
        skipped = dict(skipped or {})
        if forced is not None:
            if forced not in names:
                raise ValueError(f"{op}: forced choice {forced!r} is not one of {list(names)}")
            return self._record(KernelChoice(op, forced, source="forced", skipped=skipped))
        if len(names) == 1:
            return self._record(KernelChoice(op, names[0], source="only", skipped=skipped))
        key = self._key(op, names, shape, dtype)
        cached = self._load().get(key) if self.is_reusing_cache else None
        if cached is not None and cached.get("choice") in names:
            skipped.update(cached.get("skipped") or {})
            return self._record(KernelChoice(op, cached["choice"], source="cached", skipped=skipped))
        started = time.perf_counter()
        candidates = build()
        usable: dict[str, Callable[[], object]] = {}
        unusable: dict[str, str] = {}
        for name in names:
            candidate = candidates[name]
            if isinstance(candidate, Unusable):
                unusable[name] = candidate.reason
            else:
                usable[name] = candidate
        timings = self.measure(usable)
        self.seconds += time.perf_counter() - started
        choice = KernelChoice(
            op, pick_candidate(timings, self.margin), timings, skipped={**skipped, **unusable}
        )
        self._load()[key] = {"op": op, "choice": choice.choice, "timings": timings, "skipped": unusable}
        self._save()
        return self._record(choice)

    def measure(self, candidates: Mapping[str, Callable[[], object]]) -> dict[str, float]:
        """Best-of-num_repeats seconds per candidate after one warm-up call each, interleaved (other load on
        the machine hits every candidate alike); on CUDA each call is timed to the end of its kernels."""
        with torch.inference_mode():
            for fn in candidates.values():
                fn()
            best = dict.fromkeys(candidates, float("inf"))
            for _ in range(self.num_repeats):
                for name, fn in candidates.items():
                    _wait_for_device()
                    start = self.clock()
                    fn()
                    _wait_for_device()
                    best[name] = min(best[name], self.clock() - start)
        return best

    def _record(self, choice: KernelChoice) -> KernelChoice:
        self.choices[choice.op] = choice
        return choice

    def _key(self, op: str, names: Sequence[str], shape: tuple[int, ...], dtype: torch.dtype) -> str:
        """The cache key: the machine (and GPU), the op on its shape and dtype, and the candidates (a new one
        measures)."""
        parts = {
            **self.machine,
            "candidates": sorted(names),
            "dtype": str(dtype).replace("torch.", ""),
            "op": op,
            "shape": list(shape),
        }
        return json.dumps(parts, sort_keys=True)

    def _load(self) -> dict[str, dict]:
        if self._cache is None:
            self._cache = {}
            try:
                data = json.loads(self.cache_path.read_text())
                if not (isinstance(data, dict) and data.get("version") == _CACHE_VERSION):
                    raise ValueError("not a kernel choices file of this version")
                choices = data["choices"]
                if not isinstance(choices, dict) or not all(isinstance(v, dict) for v in choices.values()):
                    raise ValueError("malformed choices")
                self._cache = choices
            except FileNotFoundError:
                pass
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning(
                    "ignoring the kernel choices cache %s (%s); it will be rewritten", self.cache_path, exc
                )
        return self._cache

    def _save(self) -> None:
        """Atomic: a temporary file in the same directory, renamed over the cache."""
        payload = json.dumps({"version": _CACHE_VERSION, "choices": self._load()}, indent=1, sort_keys=True)
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_path.parent, prefix=".kernel_choices-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(payload)
                os.replace(tmp, self.cache_path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            logger.warning(
                "cannot write the kernel choices cache %s (%s); choices are not kept", self.cache_path, exc
            )
