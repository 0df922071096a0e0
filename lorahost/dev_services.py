"""The backing services of `lorahost dev-cluster`: a fresh PostgreSQL database, a moto S3 server, a bucket,
and the Redis keys of one cluster run (all of them under one prefix, deleted when the cluster stops)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from lorahost.processes import ChildProcess, free_port, http_ok, spawn, wait_until

DEFAULT_POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# moto accepts any credentials; boto3 needs some to sign requests
MOTO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def redact_url(url: str) -> str:
    """A database URL with its password hidden ("-" for none)."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True) if url else "-"


def create_database(admin_url: str, prefix: str = "lorahost_dev") -> str:
    """Create a uniquely named PostgreSQL database through admin_url; returns its URL."""
    from sqlalchemy import make_url

    from registry.db import make_engine

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = make_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, url: str) -> None:
    """Drop a database created by create_database (its leftover connections are terminated)."""
    from sqlalchemy import make_url

    from registry.db import make_engine

    admin = make_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
    finally:
        admin.dispose()


def moto_command(host: str, port: int) -> list[str]:
    """moto's S3 server: the `moto_server` script next to this interpreter, else `python -m moto.server`."""
    script = Path(sys.executable).with_name("moto_server")
    if script.exists():
        return [str(script), "-H", host, "-p", str(port)]
    found = shutil.which("moto_server")
    if found:
        return [found, "-H", host, "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]


def start_moto(host: str, log_path: Path, timeout_s: float) -> ChildProcess:
    """A moto S3 server on a free port, once it answers."""
    port = free_port(host)
    url = f"http://{host}:{port}"
    child = spawn("s3", moto_command(host, port), {**os.environ, **MOTO_CREDENTIALS}, log_path, url=url)
    try:
        wait_until(child, lambda: http_ok(url + "/"), timeout_s, "answering")
    except BaseException:
        child.stop(5)
        raise
    return child


def ensure_bucket(endpoint_url: str, bucket: str, region: str = "us-east-1") -> None:
    """Create the bucket unless it exists."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)


def delete_redis_keys(redis_url: str, patterns: list[str]) -> int:
    """Delete every key matching one of the patterns; returns how many (0 when Redis is unreachable)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
    num_deleted = 0
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern))
            if keys:
                num_deleted += int(client.delete(*keys))
    except redis.RedisError:
        return num_deleted
    finally:
        client.close()
    return num_deleted


def check_redis(redis_url: str) -> None:
    """RuntimeError saying what to do when Redis does not answer."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise RuntimeError(
            f"Redis at {redis_url} does not answer ({type(exc).__name__}); start it (bash scripts/services.sh) "
            "or pass --redis-url"
        ) from exc
    finally:
        client.close()


def run_cli(args: list[str], env: Mapping[str, str], timeout_s: float = 300.0) -> str:
    """Run `lorahost ARGS` with `env`; what it printed, or RuntimeError with its output when it fails."""
    result = subprocess.run(
        [sys.executable, "-m", "lorahost.cli", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"lorahost {' '.join(args)} failed ({result.returncode}): {result.stdout}{result.stderr}"
        )
    return result.stdout
