"""The usage spool: usage writes that could not reach the database (a restart, a failover) kept on the API's
local disk until they can, so a request served during an outage is still billed exactly once.

Each write is one JSON line appended and fsync'd before it counts as durable (the crash-safe protocol of
api/metering.py treats a spooled open row as a durable one): `open` (an `in_progress` row's values),
`checkpoint` (a stream's tokens so far) or `final` (the row's final values). `replay` folds the lines per
request (later values over earlier ones; a final line wins) and writes them once the database answers:
- final: the open row gets its final values (registry.usage.finish_usage), or the row is inserted when it was
  never opened in the database; a row that is final already (written before the outage ended) is left alone;
- open (with its last checkpoint): the row is inserted, or, when it exists, checkpointed;
- checkpoints alone (the row was opened in the database before the outage): the row is checkpointed.
Request ids are unique in the ledger, so replaying a line twice (a crash between a write and the spool's
rewrite) never writes a second row. What is left after a replay stops at the first database error is kept.

One file per API process (its api_instance_id) under data_dir: a process restarted under the same id replays
its predecessor's lines before it closes that predecessor's open rows as interrupted (lorahost/server_cli.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from api.errors import DATABASE_ERRORS, is_database_unavailable
from api.request_meter import ADMISSION_FIELDS
from registry.usage import DuplicateUsageError, finish_usage, record_usage
from registry.usage_batches import CHECKPOINT_FIELDS, checkpoint_usage, open_usage

log = logging.getLogger(__name__)

KINDS = ("open", "checkpoint", "final")
DATETIME_SUFFIX = "_at"  # the usage columns that hold datetimes: started_at, checkpointed_at, ...


def spool_path(data_dir: Path, api_instance_id: str) -> Path:
    """Where one API process keeps its spooled usage writes."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in api_instance_id)
    return data_dir / "usage_spool" / f"{safe}.jsonl"


def _encode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in values.items()}


def _decode(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (datetime.fromisoformat(v) if k.endswith(DATETIME_SUFFIX) and isinstance(v, str) else v)
        for k, v in values.items()
    }


class UsageSpool:
    """An append-only file of usage writes waiting for the database (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def add(self, kind: str, values: dict[str, Any]) -> None:
        """Append one write durably (fsync'd before it returns)."""
        if kind not in KINDS:
            raise ValueError(f"a spooled usage write is one of {KINDS}, not {kind!r}")
        line = json.dumps({"kind": kind, "values": _encode(values)}, separators=(",", ":")) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

    def has_pending(self) -> bool:
        """Whether any write waits (the file exists only while one does)."""
        return self.path.exists()

    def num_pending(self) -> int:
        """How many requests have writes waiting."""
        with self._lock:
            return len(self._fold())

    def replay(self, session_factory: sessionmaker[Session]) -> int:
        """Write every waiting request's rows to the database, in spool order, until done or the database fails;
        keeps what is left; returns how many requests were written."""
        with self._lock:
            pending = self._fold()
            num_written = 0
            try:
                for request_id, (is_final, values) in list(pending.items()):
                    with session_factory() as session:
                        _write(session, is_final, values)
                    del pending[request_id]
                    num_written += 1
            except DATABASE_ERRORS as exc:
                if not is_database_unavailable(exc):
                    raise
                log.warning(
                    "usage spool: the database is still unavailable; %d request(s) wait", len(pending)
                )
            finally:
                if num_written:
                    self._rewrite(pending)
        if num_written:
            log.info("usage spool: wrote %d request(s) held while the database was unavailable", num_written)
        return num_written

    def _fold(self) -> dict[str, tuple[bool, dict[str, Any]]]:
        """request id -> (is it final, its values: later lines over earlier ones), in first-seen order."""
        pending: dict[str, tuple[bool, dict[str, Any]]] = {}
        if not self.path.exists():
            return pending
        with self.path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    entry = json.loads(line)
                    kind, values = entry["kind"], _decode(entry["values"])
                    request_id = values["request_id"]
                except (ValueError, KeyError, TypeError):
                    # only a last line cut short by a crash mid-write can be torn: it was never acknowledged
                    log.warning("usage spool %s: line %d is unreadable and is skipped", self.path, number)
                    continue
                is_final, merged = pending.get(request_id, (False, {}))
                if is_final:
                    continue
                pending[request_id] = (kind == "final", {**merged, **values})
        return pending

    def _rewrite(self, pending: dict[str, tuple[bool, dict[str, Any]]]) -> None:
        if not pending:
            self.path.unlink(missing_ok=True)
            return
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as f:
            for is_final, values in pending.values():
                kind = "final" if is_final else "open"
                f.write(json.dumps({"kind": kind, "values": _encode(values)}, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)


def _write(session: Session, is_final: bool, values: dict[str, Any]) -> None:
    """One request's spooled values into the ledger, exactly once (see the module's docstring)."""
    if is_final:
        finished = {k: v for k, v in values.items() if k not in ADMISSION_FIELDS}
        if finish_usage(session, finished):
            return
        try:
            record_usage(session, **values)
        except DuplicateUsageError:
            pass  # final already: written directly once the database was back
        return
    if "tenant_id" not in values:  # checkpoints alone: the row was opened in the database before the outage
        _write_checkpoint(session, values)
        return
    try:
        open_usage(session, [values])
    except DATABASE_ERRORS as exc:
        if is_database_unavailable(exc):
            raise
        session.rollback()  # the row exists (opened before the outage, or its insert's answer was lost)
        if "checkpointed_at" in values:  # a checkpoint was spooled: newer than any the database holds
            _write_checkpoint(session, values)


def _write_checkpoint(session: Session, values: dict[str, Any]) -> None:
    checkpoint = {name: values.get(name) for name in CHECKPOINT_FIELDS}
    checkpoint_usage(session, [{**checkpoint, "request_id": values["request_id"]}])
