"""Uploads interrupted by `kill -9` of `lorahost serve` (issue 7 item 5): after a restart on the same data dir
the upload sweeps leave no scratch folder, no staging blob, no unreferenced final blob and no version stuck in
`validating`.

What is real and what is reproduced:
- The kill mid-upload is real: the client streams the multipart body slowly, the test waits until the server
  has created the upload's scratch folder (the request is being received), then sends SIGKILL.
- The states a kill leaves inside the pipeline's short windows have no deterministic moment to kill in (the
  inline validation job of a tiny adapter takes milliseconds), so the test writes them exactly as such a kill
  leaves them, with the pipeline's own functions, while the server is dead: staging blobs of a version whose
  row never committed, a local half-written blob, a `validating` row with its staging blobs (the job died),
  and a final blob copied by a job that died before marking its version ready.
Ages are shrunk through LORAHOST_* variables so the start-up sweep and the inline timer act within seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update

from lorahost.demo import free_port, setup_tenant, upload_adapter, wait_ready
from registry import adapter_pipeline as pipeline
from registry import repository
from registry.models import AdapterVersion, new_id
from registry.storage import LocalBlobStore
from settings import Settings

pytestmark = pytest.mark.slow  # starts lorahost serve subprocesses killed with SIGKILL

ADMIN_KEY = "upload-crash-admin"
WAIT_S = 180.0
MIN_AGE_S = 2.0  # orphan blobs and stale versions: the states written "an hour ago" are far older
SWEEP_INTERVAL_S = 0.5
BOUNDARY = "lorahost-slow-boundary"


class Server:
    """One `lorahost serve` subprocess on a data dir (restartable on the same dir and port)."""

    def __init__(self, data_dir: Path, base_model_dir: Path, log_path: Path) -> None:
        self.data_dir, self.base_model_dir, self.log_path = data_dir, base_model_dir, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        env = {**os.environ, "LORAHOST_ADMIN_KEY": ADMIN_KEY,
               "LORAHOST_STALE_VERSION_AGE_S": str(MIN_AGE_S), "LORAHOST_ORPHAN_BLOB_MIN_AGE_S": str(MIN_AGE_S),
               "LORAHOST_UPLOAD_SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S)}  # fmt: skip
        cmd = [sys.executable, "-m", "lorahost.cli", "serve", "--port", str(self.port), "--data-dir",
               str(self.data_dir), "--base-model", str(self.base_model_dir)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)
        wait_ready(self.url, self.proc, timeout_s=WAIT_S)  # the start-up sweep runs before the API answers
        return self

    def kill_9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)


@pytest.fixture
def server(tmp_path: Path, base_model_dir: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", base_model_dir, tmp_path / "serve.log")
    try:
        yield srv.start()
    finally:
        srv.stop()


# ---- the real kill: mid-body ---------------------------------------------------------------------------------


def _slow_body(adapter_dir: Path, release: threading.Event) -> Iterator[bytes]:
    """A multipart body that sends its first bytes, then stalls until `release` (the kill) is set."""
    weights = (adapter_dir / pipeline.WEIGHTS_FILENAME).read_bytes()
    yield (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\ninterrupted\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; '
        f'filename="{pipeline.WEIGHTS_FILENAME}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    yield weights[: len(weights) // 2]
    release.wait(timeout=WAIT_S)  # never completes the body: the server is killed while receiving it


def _send_slowly(url: str, key: str, adapter_dir: Path, release: threading.Event) -> threading.Thread:
    def send() -> None:
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
        }
        try:
            httpx.post(f"{url}/v1/adapters", content=_slow_body(adapter_dir, release), headers=headers,
                       timeout=WAIT_S)  # fmt: skip
        except httpx.HTTPError:
            pass  # the kill drops the connection

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _scratch_folders(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "upload-tmp").glob("*/lorahost-upload-*"))


def _kill_mid_body(srv: Server, key: str, adapter_dir: Path) -> None:
    release = threading.Event()
    thread = _send_slowly(srv.url, key, adapter_dir, release)
    deadline = time.monotonic() + WAIT_S
    while not _scratch_folders(srv.data_dir):  # the server is receiving the body
        assert time.monotonic() < deadline, "the upload never reached the server"
        time.sleep(0.01)
    srv.kill_9()
    release.set()
    thread.join(timeout=60)
    assert _scratch_folders(srv.data_dir), "the kill left no scratch folder: nothing to sweep"


# ---- the reproduced states (written while the server is dead) --------------------------------------------------


def _context(srv: Server) -> pipeline.AdapterJobContext:
    return pipeline.make_job_context(Settings(data_dir=srv.data_dir, base_model_path=srv.base_model_dir))


def _store(srv: Server) -> LocalBlobStore:
    return LocalBlobStore((srv.data_dir / "blobs").resolve())


def _staging_without_row(srv: Server, adapter_dir: Path) -> list[str]:
    """Killed between stage_upload's blob writes and its commit: blobs, no row, and a half-written blob."""
    store, version_id = _store(srv), new_id()
    keys = list(pipeline.staging_keys(version_id).values())
    store.put_file(keys[0], adapter_dir / pipeline.CONFIG_FILENAME)
    partial = store.root / f"uploads/{version_id}/.tmp-killed.part"
    partial.write_bytes(b"half of the weights")
    return [keys[0], partial.relative_to(store.root).as_posix()]


def _validating_row(srv: Server, tenant_id: str, adapter_dir: Path, tmp: Path) -> tuple[str, str]:
    """Killed after the `validating` row committed, while its job ran: a row with staging blobs, and the
    job's copy at the final keys. Returns (version id, the copied final key)."""
    ctx = _context(srv)
    upload = tmp / f"upload-{new_id()}"
    upload.mkdir()
    for name in pipeline.STORED_FILENAMES:
        (upload / name).write_bytes((adapter_dir / name).read_bytes())
    with ctx.session_factory() as session:
        version = pipeline.accept_upload(session, ctx, tenant_id=tenant_id, name="killed-in-job", visibility=None,
                                         upload_dir=upload, names=list(pipeline.STORED_FILENAMES))  # fmt: skip
        dest = pipeline.final_keys(tenant_id, version.adapter_id, version.number)
    ctx.blob_store.put_file(dest[pipeline.CONFIG_FILENAME], upload / pipeline.CONFIG_FILENAME)
    return version.id, dest[pipeline.CONFIG_FILENAME]


def _backdate(srv: Server, version_id: str | None = None) -> None:
    """Make the written state an hour old: blob mtimes and, for a version, its created_at."""
    moment = (datetime.now(UTC) - timedelta(hours=1)).timestamp()
    for path in _store(srv).root.rglob("*"):
        if path.is_file():
            os.utime(path, (moment, moment))
    if version_id is not None:
        ctx = _context(srv)
        with ctx.session_factory() as session:
            session.execute(update(AdapterVersion).where(AdapterVersion.id == version_id)
                            .values(created_at=datetime.now(UTC) - timedelta(hours=1)))  # fmt: skip
            session.commit()


# ---- checks --------------------------------------------------------------------------------------------------


def _status(srv: Server, version_id: str) -> tuple[str, str | None]:
    ctx = _context(srv)
    with ctx.session_factory() as session:
        version = repository.get_version(session, version_id)
        return version.status, version.failure_reason


def _statuses(srv: Server) -> set[str]:
    with _context(srv).session_factory() as session:
        return set(session.scalars(select(AdapterVersion.status)))


def _all_blob_files(srv: Server) -> list[str]:
    root = _store(srv).root
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _wait_until(predicate, timeout_s: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_kill_9_mid_upload_then_restart_leaves_no_scratch_folder_or_staging_blob(
    server: Server, adapter_dirs: dict[str, Path]
) -> None:
    adapter_dir = next(iter(adapter_dirs.values()))
    _, key = setup_tenant(server.url, ADMIN_KEY)
    ready = upload_adapter(server.url, key, "kept", adapter_dir)
    kept_files = _all_blob_files(server)
    _kill_mid_body(server, key, adapter_dir)
    orphans = _staging_without_row(server, adapter_dir)
    _backdate(server)
    assert set(orphans) <= set(_all_blob_files(server))

    server.start()

    assert _scratch_folders(server.data_dir) == []
    assert _all_blob_files(server) == kept_files  # every orphan gone, the ready version's files kept
    assert _status(server, ready["id"])[0] == "ready"
    assert "upload scratch folder" in server.log_path.read_text()


def test_kill_9_while_a_version_validates_then_restart_fails_it_and_deletes_its_blobs(
    server: Server, adapter_dirs: dict[str, Path], tmp_path: Path
) -> None:
    adapter_dir = next(iter(adapter_dirs.values()))
    tenant_id, key = setup_tenant(server.url, ADMIN_KEY)
    upload_adapter(server.url, key, "kept", adapter_dir)
    kept_files = _all_blob_files(server)
    _kill_mid_body(server, key, adapter_dir)
    version_id, copied = _validating_row(server, tenant_id, adapter_dir, tmp_path)
    _backdate(server, version_id)
    assert copied in _all_blob_files(server) and _status(server, version_id)[0] == "validating"

    server.start()  # the start-up sweep

    status, reason = _status(server, version_id)
    assert status == "failed" and "upload the adapter again" in (reason or "")
    assert _all_blob_files(server) == kept_files
    assert "validating" not in _statuses(server) and _scratch_folders(server.data_dir) == []

    # While it serves, the inline timer sweeps: the same state written now is failed once it is stale.
    live_id, _ = _validating_row(server, tenant_id, adapter_dir, tmp_path)
    assert _wait_until(lambda: _status(server, live_id)[0] == "failed"), "the inline upload sweep never ran"
    assert _wait_until(lambda: _all_blob_files(server) == kept_files), _all_blob_files(server)
