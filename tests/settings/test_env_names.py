"""Every LORAHOST_* name of the flat settings (old_env_names.txt, generated before the split into sections)
still sets the same setting, from the environment and as a constructor keyword."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

from settings import Settings
from settings.env import flat_fields
from settings.section import ENV_PREFIX, env_name

OLD_NAMES = [
    line
    for line in (Path(__file__).parent / "old_env_names.txt").read_text().splitlines()
    if not line.startswith("#")
]
# Settings added since the split (each environment name is a contract from its first release on).
NEW_NAMES = [
    "LORAHOST_ENGINE_MAX_RUNNING_TOKENS",
    "LORAHOST_ENGINE_NUM_SCHEDULER_STEPS",
    "LORAHOST_ENGINE_MAX_COMPACTION_PAGES",
    "LORAHOST_PLACEMENT_PLANNER_PROFILE",
    "LORAHOST_PLACEMENT_PLANNER_CACHE_DIR",
    "LORAHOST_PLACEMENT_PLANNER_MAX_RUNNING",
    "LORAHOST_PLACEMENT_PLANNER_MAX_QUEUED",
    "LORAHOST_PLACEMENT_PLANNER_TIME_LIMIT_S",
    "LORAHOST_PLACEMENT_PLANNER_SEARCH_MAX_CHECKS",
    "LORAHOST_PLACEMENT_PLANNER_SEARCH_MAX_S",
    "LORAHOST_ENGINE_BACKEND",
    "LORAHOST_ENGINE_MAX_LORAS",
    "LORAHOST_ENGINE_MAX_CPU_LORAS",
    "LORAHOST_ENGINE_MAX_LORA_RANK",
    "LORAHOST_ENGINE_LINEAR_WEIGHTS",
    "LORAHOST_ENGINE_ONEDNN_CACHE_CAPACITY",
    "LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES",
    "LORAHOST_WORKER_EMBEDDED_IDLE_S",
    "LORAHOST_WORKER_EMBEDDED_MEMORY_FRACTION",
    "LORAHOST_IS_CONSOLE_ENABLED",
    "LORAHOST_CONSOLE_SECRET",
    "LORAHOST_CONSOLE_SESSION_TTL_S",
    "LORAHOST_CONSOLE_MAX_SIGN_INS_PER_MIN",
    "LORAHOST_FORWARDED_ALLOW_IPS",
    "LORAHOST_MAX_KEYS_PER_TENANT",
    "LORAHOST_ENGINE_PREFILL_ATTENTION",
    "LORAHOST_ENGINE_DECODE_STEP",
    "LORAHOST_ENGINE_COMPILE_BUDGET_S",
    "LORAHOST_ENGINE_CUDA_GRAPHS",
    "LORAHOST_ENGINE_CUDA_GRAPH_MAX_BATCH_SIZE",
    "LORAHOST_ENGINE_CUDA_GRAPH_CAPTURE_BUDGET_S",
    "LORAHOST_ENGINE_CUDA_GRAPH_MAX_POOL_BYTES",
    "LORAHOST_ROUTER_MAX_LOAD_GAP",
    "LORAHOST_PLACEMENT_REPLICATION_HEADROOM",
    "LORAHOST_PLACEMENT_REPLICATION_HYSTERESIS",
    "LORAHOST_PLACEMENT_MAX_WORKER_RANK_SUM",
    "LORAHOST_ENGINE_MAX_RUNNING_ADAPTER_MIB",
    "LORAHOST_ENGINE_MULTIQUEUE_SIZING",
    "LORAHOST_ENGINE_MULTIQUEUE_MAX_WAIT_S",
    "LORAHOST_CACHE_STALE_ON_DB_OUTAGE_S",
    "LORAHOST_CELERY_VISIBILITY_TIMEOUT_S",
    "LORAHOST_MAX_WORKER_CONNECTIONS",
    "LORAHOST_WORKER_READ_TIMEOUT_S",
    "LORAHOST_STREAM_KEEPALIVE_S",
    "LORAHOST_USAGE_ROLLUP_SETTLE_S",
    "LORAHOST_IMPORT_HF_ENDPOINT",
    "LORAHOST_IS_IMPORT_HF_ENABLED",
    "LORAHOST_DATABASE_POOL_SIZE",
    "LORAHOST_REDIS_MAX_CONNECTIONS",
    "LORAHOST_IS_ACCESS_LOGGED",
]
# Settings with a fixed set of valid values: (environment text, parsed value), not the default.
CHOICES: dict[str, tuple[str, Any]] = {
    "router_policy": ("rank_aware", "rank_aware"),
    "import_hf_endpoint": ("https://hf-mirror.example/", "https://hf-mirror.example"),
    "placement_policy": ("random", "random"),
    "length_predictor": ("max_tokens", "max_tokens"),
    "engine_batch_policy": ("sjf", "sjf"),
    "engine_multiqueue_sizing": ("wrs", "wrs"),
    "engine_backend": ("vllm", "vllm"),
    "adapter_eviction_policy": ("chameleon", "chameleon"),
    "engine_memory_mode": ("static", "static"),
    "engine_dtype": ("float32", "float32"),
    "engine_device": ("cpu", "cpu"),
    "engine_linear_weights": ("packed", "packed"),
    "engine_prefill_gemm": ("plain", "plain"),
    "engine_decode_attention": ("c_kernel", "c_kernel"),
    "engine_prefill_attention": ("triton", "triton"),
    "engine_decode_lora_form": ("stacked", "stacked"),
    "engine_decode_step": ("compiled", "compiled"),
    "import_allowed_buckets": ("a, b", ("a", "b")),
    "forwarded_allow_ips": ("10.0.0.0/8, 127.0.0.1", ("10.0.0.0/8", "127.0.0.1")),
    "worker_operating_points": ('{"8": 900}', {8: 900.0}),
}


def _sample(flat: str) -> tuple[str, Any]:
    """A valid value other than the default: (environment text, the value it parses to)."""
    if flat in CHOICES:
        return CHOICES[flat]
    info = flat_fields(Settings)[flat][1]
    kinds = [a for a in typing.get_args(info.annotation) or (info.annotation,) if a is not type(None)]
    default = info.get_default(call_default_factory=True)
    if kinds[0] is bool:
        return str(not default).lower(), not default
    if kinds[0] is int:
        value = default + 1 if default is not None else 3
        return str(value), value
    if kinds[0] is float:
        value = default / 2 if default else 2.5
        return str(value), value
    if kinds[0] is Path:
        return "/tmp/lorahost-setting", Path("/tmp/lorahost-setting")
    return "some-value", "some-value"


def _read(settings: Settings, flat: str) -> Any:
    section, info = flat_fields(Settings)[flat]
    holder = settings if section is None else getattr(settings, section)
    name = flat if section is None else next(n for n, i in type(holder).model_fields.items() if i is info)
    return getattr(holder, name)


def test_the_old_and_new_name_lists_are_exactly_the_settings_flat_names() -> None:
    assert len(OLD_NAMES) == 107
    assert sorted(env_name(flat) for flat in flat_fields(Settings)) == sorted(OLD_NAMES + NEW_NAMES)


@pytest.mark.parametrize("name", OLD_NAMES + NEW_NAMES)
def test_each_old_environment_name_sets_its_setting(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    flat = name.removeprefix(ENV_PREFIX).lower()
    text, value = _sample(flat)
    assert _read(Settings(), flat) != value
    monkeypatch.setenv(name, text)
    assert _read(Settings(), flat) == value


@pytest.mark.parametrize("name", OLD_NAMES + NEW_NAMES)
def test_each_old_name_is_a_constructor_keyword_that_wins_over_the_environment(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flat = name.removeprefix(ENV_PREFIX).lower()
    text, value = _sample(flat)
    monkeypatch.setenv(name, text)
    default = flat_fields(Settings)[flat][1].get_default(call_default_factory=True)
    assert _read(Settings(**{flat: default}), flat) == default
    assert _read(Settings(**{flat: value}), flat) == value


def test_environment_names_are_matched_without_regard_to_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("lorahost_engine_num_threads", "3")
    assert Settings().engine.num_threads == 3


def test_a_bad_value_names_the_old_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAHOST_ENGINE_DECODE_ATTENTION", "flash")
    with pytest.raises(ValueError, match=r"(?s)engine_decode_attention.*LORAHOST_ENGINE_DECODE_ATTENTION"):
        Settings()


def test_updated_replaces_settings_by_flat_name_and_keeps_the_rest() -> None:
    settings = Settings(worker_id="w1", engine_max_num_seqs=7)
    copy = settings.updated(worker_advertise_url="http://w:1", data_dir=Path("/tmp/elsewhere"))
    assert (copy.worker.advertise_url, copy.worker.id, copy.engine.max_num_seqs) == ("http://w:1", "w1", 7)
    assert copy.data_dir == Path("/tmp/elsewhere") and settings.worker.advertise_url is None


def test_env_vars_rebuild_the_same_settings_in_a_child_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(
        worker_port=9001, engine_num_threads=1, engine_adapter_cache=False, import_allowed_buckets="a,b",
        worker_operating_points={8: 900.0}, data_dir=Path("/tmp/x"),
    )  # fmt: skip
    env = settings.env_vars()
    assert env["LORAHOST_WORKER_PORT"] == "9001" and env["LORAHOST_ENGINE_ADAPTER_CACHE"] == "false"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings() == settings
