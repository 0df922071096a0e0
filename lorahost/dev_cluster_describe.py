"""What a running `lorahost dev-cluster` is made of and how each of its processes is, as the CLI prints it."""

from __future__ import annotations

from lorahost import dev_services
from lorahost.dev_cluster import INTERNAL_READY_PATH, DevCluster
from lorahost.processes import child_state, http_ok


def describe_cluster(cluster: DevCluster) -> str:
    """What runs where (printed by the CLI)."""
    lines = [f"lorahost dev-cluster (run {cluster.run_id}, data {cluster.data_dir})"]
    lines += [f"  API        {url}" for url in cluster.api_urls]
    lines.append(f"  admin key  {cluster.admin_key}")
    lines += [
        f"  worker     {w.worker_id} at {w.url} ({w.engine} engine, {w.base_model})" for w in cluster.workers
    ]
    lines.append(
        f"  jobs       {'celery worker + beat, queue ' + cluster.celery_queue if cluster.jobs else 'off'}"
    )
    lines.append(f"  database   {dev_services.redact_url(cluster.database_url or '')}")
    lines.append(f"  redis      {cluster.config.redis_url} (keys under {cluster.key_prefix})")
    lines.append(f"  s3         {cluster.services.s3_endpoint} bucket {cluster.config.bucket}")
    lines.append(f"  base model {cluster.config.base_model_name} = {cluster.services.base_model}")
    lines += [f"  catalog    {name} = {path}" for name, path in cluster.config.catalog_models.items()]
    lines.append(
        f"  autoscale  {'on (max ' + str(cluster.config.max_workers) + ' workers)' if cluster.config.is_autoscale else 'off'}"
    )
    lines.append(f"  logs       {cluster.data_dir / 'logs'}")
    return "\n".join(lines)


def cluster_health(cluster: DevCluster) -> dict[str, str]:
    """name -> ok / down / exited(code), for every process of the cluster."""
    token = {"Authorization": f"Bearer {cluster.internal_token}"}
    status: dict[str, str] = {}
    for api in cluster.apis:
        status[api.name] = child_state(api, http_ok(f"{api.url}/v1/health"))
    for worker in cluster.workers:
        status[worker.worker_id] = child_state(
            worker.process, http_ok(worker.url + INTERNAL_READY_PATH, token)
        )
    if cluster.jobs is not None:
        status[cluster.jobs.name] = child_state(cluster.jobs, True)
    s3 = cluster.services.s3
    if s3 is not None:
        status[s3.name] = child_state(s3, http_ok(f"{s3.url}/"))
    return status
