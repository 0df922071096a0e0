"""The Helm chart under deploy/helm/lorahost: rendered by Helm's engine, every object schema-validated, and the
topology the platform needs (GPU workers per base model scaled by KEDA to zero, one beat, secrets by
reference, migrations before the pods, probes on the real health routes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cluster.protocol import INTERNAL_PREFIX
from tests.deploy.manifests import (
    CHART_DIR,
    NAMESPACE,
    by_kind,
    containers,
    named,
    render,
    require,
    validate,
    validate_keda,
)

pytestmark = pytest.mark.slow  # renders the chart with helm and validates every manifest

SENTINELS = {
    "adminKey": "sentinel-admin-key-5f1c",
    "internalToken": "sentinel-internal-token-9a2e",
    "databaseUrl": "postgresql+psycopg://lorahost:sentinel-db-pw-77b3@db:5432/lorahost",
    "redisUrl": "redis://:sentinel-redis-pw-c0d4@redis:6379/0",
    "s3AccessKeyId": "sentinel-s3-id-1a1a",
    "s3SecretAccessKey": "sentinel-s3-secret-2b2b",
}


def custom_values() -> dict[str, Any]:
    """Two base models, a chart-made Secret, an Ingress and extra settings: every optional branch on."""
    return {
        "image": {"repository": "registry.example.com/lorahost", "tag": "1.2.3"},
        "secrets": {"existingSecret": "", "values": dict(SENTINELS)},
        "config": {"s3EndpointUrl": "http://minio:9000", "env": {"LORAHOST_ENGINE_MAX_NUM_SEQS": 128}},
        "baseModels": [
            {
                "name": "llama-8b",
                "volume": {"persistentVolumeClaim": {"claimName": "llama-8b", "readOnly": True}},
                "resources": {"limits": {"nvidia.com/gpu": 2}},
                "minReplicas": 0,
                "maxReplicas": 8,
                "env": {"LORAHOST_ENGINE_DTYPE": "bfloat16"},
                "engine": "vllm",
                "image": {"repository": "registry.example.com/lorahost-vllm"},
            },
            {
                "name": "qwen-7b",
                "volume": {"nfs": {"server": "nfs.example.com", "path": "/models/qwen-7b", "readOnly": True}},
                "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"]}],
                "resources": {"limits": {"nvidia.com/gpu": 1}},
                "minReplicas": 1,
                "maxReplicas": 2,
            },
        ],
        "api": {
            "replicas": 3,
            "ingress": {"enabled": True, "className": "nginx", "tls": [{"secretName": "t"}]},
        },
    }


def worker_name(model: str) -> str:
    return f"lorahost-worker-{model}"


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("values", [None, custom_values()], ids=["defaults", "custom"])
def test_every_rendered_object_is_valid_for_kubernetes_and_keda(values: dict[str, Any] | None) -> None:
    objects = render(values)
    assert len(objects) >= 10
    for obj in objects:
        validate(obj)


def test_helm_lint_reports_no_errors() -> None:
    helm = require("helm_python")
    for values in (None, custom_values()):
        report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
        errors = [
            m for m in report["messages"] if m["severity"] >= 2 and "icon is recommended" not in m["error"]
        ]
        assert not report["errors"] and not errors, report


def test_validators_reject_broken_objects() -> None:
    """The checks above mean something: a misspelt field fails both the Kubernetes and the KEDA schema."""
    import jsonschema

    objects = render()
    deployment = copy.deepcopy(named(objects, "Deployment", "lorahost-api"))
    containers(deployment)[0]["imagePullPolicyy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate(deployment)
    scaled = copy.deepcopy(by_kind(objects, "ScaledObject")[0])
    scaled["spec"]["minReplicas"] = scaled["spec"].pop("minReplicaCount")
    with pytest.raises(jsonschema.ValidationError):
        validate_keda(scaled)


def test_one_gpu_worker_deployment_and_service_per_base_model() -> None:
    objects = render(custom_values())
    for model, num_gpus in (("llama-8b", 2), ("qwen-7b", 1)):
        deployment = named(objects, "Deployment", worker_name(model))
        worker = containers(deployment)[0]
        assert worker["command"] == ["lorahost", "worker"]
        assert "--advertise-url=http://$(POD_IP):9100" in worker["args"]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == num_gpus
        env = env_of(worker)
        assert env["LORAHOST_BASE_MODEL_NAME"]["value"] == model
        assert env["LORAHOST_BASE_MODEL_PATH"]["value"] == f"/models/{model}"
        assert (
            "LORAHOST_DATABASE_URL" not in env and "LORAHOST_ADMIN_KEY" not in env
        )  # workers hold no DB/admin
        assert "replicas" not in deployment["spec"]  # KEDA owns the count; an upgrade must not reset it
        service = named(objects, "Service", worker_name(model))
        assert (
            service["spec"]["selector"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )
    assert (
        env_of(containers(named(objects, "Deployment", worker_name("llama-8b")))[0])["LORAHOST_ENGINE_DTYPE"][
            "value"
        ]
        == "bfloat16"
    )


def test_a_model_without_a_volume_is_fetched_from_the_catalog_and_nothing_mounts_it() -> None:
    """The default values: no model volume on the worker, the API or the Celery worker (they read the catalog);
    the worker's data volume, where it fetches the model, is bounded."""
    objects = render()
    deployment = named(objects, "Deployment", worker_name("lorahost-base"))
    worker = containers(deployment)[0]
    env = env_of(worker)
    assert (
        env["LORAHOST_BASE_MODEL_NAME"]["value"] == "lorahost-base" and "LORAHOST_BASE_MODEL_PATH" not in env
    )
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert set(volumes) == {"data"} and volumes["data"]["emptyDir"]["sizeLimit"] == "64Gi"
    for name in ("lorahost-api", "lorahost-celery-worker"):
        platform = named(objects, "Deployment", name)
        assert "LORAHOST_BASE_MODEL_PATH" not in env_of(containers(platform)[0])
        assert "model" not in {v["name"] for v in platform["spec"]["template"]["spec"]["volumes"]}


def test_each_base_model_chooses_its_engine_and_worker_image() -> None:
    objects = render(custom_values())
    for model, engine, image in (
        ("llama-8b", "vllm", "registry.example.com/lorahost-vllm:1.2.3"),  # its own image, the chart's tag
        ("qwen-7b", "native", "registry.example.com/lorahost:1.2.3"),  # the default engine and image
    ):
        deployment = named(objects, "Deployment", worker_name(model))
        worker = containers(deployment)[0]
        assert f"--engine={engine}" in worker["args"] and worker["image"] == image
        assert deployment["metadata"]["labels"]["lorahost.dev/engine"] == engine
    api = containers(named(objects, "Deployment", "lorahost-api"))[0]
    assert api["image"] == "registry.example.com/lorahost:1.2.3"  # only workers take a model's image


def test_default_worker_requests_a_gpu() -> None:
    worker = containers(named(render(), "Deployment", worker_name("lorahost-base")))[0]
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_scaled_object_targets_its_worker_and_scales_to_zero_on_desired_workers() -> None:
    objects = render(custom_values())
    auth = by_kind(objects, "TriggerAuthentication")
    assert len(auth) == 1
    assert auth[0]["spec"]["secretTargetRef"] == [
        {"parameter": "token", "name": "lorahost-secrets", "key": "admin-key"}
    ]
    scaled = {obj["spec"]["scaleTargetRef"]["name"]: obj for obj in by_kind(objects, "ScaledObject")}
    assert set(scaled) == {worker_name("llama-8b"), worker_name("qwen-7b")}
    spec = scaled[worker_name("llama-8b")]["spec"]
    assert spec["minReplicaCount"] == 0 and spec["maxReplicaCount"] == 8 and spec["cooldownPeriod"] > 0
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["url"] == (
        f"http://lorahost-api.{NAMESPACE}.svc:8000/v1/admin/scaling?base_model=llama-8b"
    )
    assert trigger["metadata"]["valueLocation"] == "desired_workers"
    assert trigger["metadata"]["targetValue"] == "1" and trigger["metadata"]["authMode"] == "bearer"
    assert trigger["authenticationRef"]["name"] == auth[0]["metadata"]["name"]
    named(objects, "Service", "lorahost-api")  # the URL's Service exists
    assert scaled[worker_name("qwen-7b")]["spec"]["minReplicaCount"] == 1


def test_prometheus_trigger_queries_the_desired_workers_gauge() -> None:
    values = {"autoscaling": {"keda": {"trigger": "prometheus"}}}
    objects = render(values)
    assert not by_kind(objects, "TriggerAuthentication")
    (scaled,) = by_kind(objects, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"] == 'max(lorahost_desired_workers{base_model="lorahost-base"})'
    for obj in objects:
        validate(obj)


def test_without_keda_workers_run_fixed_replicas() -> None:
    values = custom_values()
    values["autoscaling"] = {"keda": {"enabled": False}}
    values["baseModels"][0]["replicas"] = 3
    objects = render(values)
    assert not by_kind(objects, "ScaledObject") and not by_kind(objects, "TriggerAuthentication")
    assert named(objects, "Deployment", worker_name("llama-8b"))["spec"]["replicas"] == 3


def test_beat_runs_exactly_one_replica_replaced_with_recreate() -> None:
    beat = named(render(), "Deployment", "lorahost-celery-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert containers(beat)[0]["command"] == ["celery", "-A", "jobs.worker", "beat"]
    worker = containers(named(render(), "Deployment", "lorahost-celery-worker"))[0]
    assert worker["command"] == ["celery", "-A", "jobs.worker", "worker"]


def test_secrets_are_referenced_never_inlined() -> None:
    objects = render(custom_values())
    (secret,) = by_kind(objects, "Secret")
    assert secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    for obj in objects:
        if obj["kind"] == "Secret":
            continue
        text = repr(obj)
        leaked = [name for name, value in SENTINELS.items() if value in text]
        assert not leaked, f"{obj['kind']} {obj['metadata']['name']} inlines {leaked}"
    api = containers(named(objects, "Deployment", "lorahost-api"))[0]
    env = env_of(api)
    for var in (
        "LORAHOST_ADMIN_KEY",
        "LORAHOST_INTERNAL_TOKEN",
        "LORAHOST_DATABASE_URL",
        "LORAHOST_REDIS_URL",
    ):
        assert env[var]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
        assert env[var]["valueFrom"]["secretKeyRef"]["key"] in secret["stringData"]


def test_existing_secret_is_used_and_no_secret_is_rendered() -> None:
    objects = render({"secrets": {"existingSecret": "platform-keys"}})
    assert not by_kind(objects, "Secret")
    job = named(objects, "Job", "lorahost-db-upgrade")
    ref = env_of(containers(job)[0])["LORAHOST_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "platform-keys", "key": "database-url"}
    assert (
        by_kind(objects, "TriggerAuthentication")[0]["spec"]["secretTargetRef"][0]["name"] == "platform-keys"
    )


def test_migrations_run_as_a_hook_before_install_and_upgrade() -> None:
    job = named(render(), "Job", "lorahost-db-upgrade")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert containers(job)[0]["command"] == ["lorahost", "db", "upgrade"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_probes_use_the_processes_real_health_routes() -> None:
    from api.routes.health import router as health_router

    objects = render()
    api = containers(named(objects, "Deployment", "lorahost-api"))[0]
    api_paths = {route.path for route in health_router.routes}
    assert api["readinessProbe"]["httpGet"]["path"] in api_paths
    assert api["command"][:2] == ["lorahost", "api"]
    worker = containers(named(objects, "Deployment", worker_name("lorahost-base")))[0]
    ready_cmd = worker["readinessProbe"]["exec"]["command"][-1]
    assert f"http://127.0.0.1:9100{INTERNAL_PREFIX}/ready" in ready_cmd
    assert "LORAHOST_INTERNAL_TOKEN" in ready_cmd and "LORAHOST_INTERNAL_TOKEN" in env_of(worker)
    assert f"{INTERNAL_PREFIX}/health" in worker["livenessProbe"]["exec"]["command"][-1]


def test_cli_commands_in_the_chart_exist() -> None:
    from lorahost.cli import app, db_app

    commands = {command.name for command in app.registered_commands}
    assert {"api", "worker"} <= commands
    assert "upgrade" in {command.name for command in db_app.registered_commands}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {
                "baseModels": [
                    {
                        "name": "Llama_8B",
                        "volume": {"emptyDir": {}},
                        "resources": {},
                        "minReplicas": 0,
                        "maxReplicas": 1,
                    }
                ]
            },
            "name",
        ),
        (
            {
                "baseModels": [
                    {
                        "name": "llama-8b",
                        "volume": {"emptyDir": {}},
                        "resources": {},
                        "minReplicas": 0,
                        "maxReplicas": 1,
                        "engine": "tgi",
                    }
                ]
            },
            "engine",
        ),
        ({"secrets": {"existingSecret": ""}}, "adminKey"),
        ({"api": {"replicas": 0}}, "replicas"),
    ],
    ids=["bad-base-model-name", "unknown-engine", "missing-secret-values", "no-api"],
)
def test_bad_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    helm = require("helm_python")
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def test_the_api_trusts_forwarded_headers_only_from_the_ingress_networks_or_as_set() -> None:
    """Issue 33 item 7: never uvicorn's FORWARDED_ALLOW_IPS nor "*"; with the chart's ingress, the private
    networks of its controller's pods; an explicit value wins; without ingress and value, nobody."""

    def api_env(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        return env_of(containers(named(render(values), "Deployment", "lorahost-api"))[0])

    plain = api_env(None)
    assert "FORWARDED_ALLOW_IPS" not in plain and "LORAHOST_FORWARDED_ALLOW_IPS" not in plain
    behind_ingress = api_env(custom_values())["LORAHOST_FORWARDED_ALLOW_IPS"]["value"]
    assert behind_ingress == "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"
    narrowed = custom_values()
    narrowed["api"]["forwardedAllowIps"] = "10.42.0.0/16"
    assert api_env(narrowed)["LORAHOST_FORWARDED_ALLOW_IPS"]["value"] == "10.42.0.0/16"
