"""Download a Hub snapshot's files (registry/hub_source.py) into an import's own work dir: pinned to the
resolved commit, resumable, and never past a file's declared size.

- URLs are `{endpoint}/{repo}/resolve/{commit}/{file}`: the commit, never the branch name, so a branch that
  moves during the import cannot mix versions; a response naming another commit (X-Repo-Commit) is refused.
- Resumable: a transfer that breaks mid-file (connection reset, a short body) is resumed with
  `Range: bytes=<bytes already written>-` up to MAX_ATTEMPTS times; a server that ignores the range (200) is
  read again from the start. The work dir is the import's own (no Hub cache shared between tenants: caches
  are keyed by who may see them).
- Bounded: a file's bytes are written only up to the size the Hub declared for it (checked against the upload
  limit and the plan's storage before the download started); one byte more ends the import as unreadable.
- The tenant's token goes to the endpoint only (httpx drops Authorization on a redirect to another origin,
  e.g. the Hub's CDN); never HF_TOKEN or a stored token. The environment's proxy settings apply, as to
  huggingface_hub's metadata calls: the endpoint, and so the route to it, is the operator's (httpx reads no
  .netrc unless asked).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

import httpx

from registry.hub_source import HubCredentials, HubFile, HubRepo, HubSnapshot

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
MAX_ATTEMPTS = 5
RETRY_BACKOFF_S = (0.0, 1.0, 2.0, 4.0)  # before the 2nd, 3rd, ... attempt of one file
MAX_REDIRECTS = 5


class HubTransferError(OSError):
    """A transfer broke off before the file was complete (retried from the bytes written)."""


def download_snapshot(
    repo: HubRepo, snapshot: HubSnapshot, credentials: HubCredentials | None, endpoint: str, dest: Path
) -> list[str]:
    """Write the snapshot's files into `dest` (see the module docstring); returns their names."""
    headers = {"Accept-Encoding": "identity", "User-Agent": "lorahost"}
    if credentials is not None:
        headers["Authorization"] = f"Bearer {credentials.token}"
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    with httpx.Client(
        trust_env=True, follow_redirects=True, max_redirects=MAX_REDIRECTS, timeout=timeout, headers=headers
    ) as client:
        for file in snapshot.files:
            url = f"{endpoint}/{repo.repo_id}/resolve/{snapshot.commit}/{quote(file.name)}"
            download_resumable(client, url, dest / file.name, file, snapshot.commit)
    return [file.name for file in snapshot.files]


def download_resumable(client: httpx.Client, url: str, path: Path, file: HubFile, commit: str) -> None:
    """Fetch `url` into `path` until it holds the file's declared size, resuming after a broken transfer."""
    path.touch()
    for attempt in range(MAX_ATTEMPTS):
        if attempt:
            time.sleep(RETRY_BACKOFF_S[min(attempt - 1, len(RETRY_BACKOFF_S) - 1)])
        try:
            _fetch_rest(client, url, path, file, commit)
        except (httpx.TransportError, HubTransferError):
            if attempt + 1 == MAX_ATTEMPTS:
                raise
            continue
        return


def _fetch_rest(client: httpx.Client, url: str, path: Path, file: HubFile, commit: str) -> None:
    """One GET of the bytes `path` still lacks (a Range request when some are written)."""
    num_written = path.stat().st_size
    if num_written == file.num_bytes:
        return
    headers = {"Range": f"bytes={num_written}-"} if num_written else {}
    with client.stream("GET", url, headers=headers) as response:
        offset = _response_offset(response, num_written, commit)
        with open(path, "r+b") as out:
            out.truncate(offset)
            out.seek(offset)
            _copy_within(response, out, file.num_bytes - offset)
    if path.stat().st_size < file.num_bytes:
        raise HubTransferError("the body ended before the declared size")


def _response_offset(response: httpx.Response, num_written: int, commit: str) -> int:
    """Where the response's body starts in the file: `num_written` for a 206 of that range, 0 for a 200."""
    served_commit = response.headers.get("x-repo-commit")
    if served_commit is not None and served_commit != commit:
        raise OSError("the Hub served another commit than the one resolved")
    if response.status_code == 200:
        return 0
    expected = f"bytes {num_written}-"
    if response.status_code == 206 and response.headers.get("content-range", "").startswith(expected):
        return num_written
    raise OSError(f"HTTP {response.status_code}")


def _copy_within(response: httpx.Response, out: BinaryIO, max_bytes: int) -> None:
    """Copy the body to `out`, refusing it (before writing) once it passes `max_bytes`."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise OSError("the body is larger than the file's declared size")
    num_left = max_bytes
    for chunk in response.iter_raw():  # as received: a broken transfer keeps every byte that arrived
        if len(chunk) > num_left:
            raise OSError("the body is larger than the file's declared size")
        out.write(chunk)
        num_left -= len(chunk)
