"""A redis-server of a run's own on a free port (no persistence: a restart starts it empty), for chaos runs
(benchmarks/chaos.py) and tests that stop and start Redis under a running cluster."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LocalRedis:
    """A redis-server on `port` keeping its files in `data_dir`; start() returns once it answers."""

    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                   "no", "--dir", str(self.data_dir)]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
            finally:
                client.close()
        raise RuntimeError(f"redis-server on {self.port} did not answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None
