"""A local HTTP server speaking the Hugging Face Hub's file API, as huggingface_hub and the Hub import call it:
GET /api/models/{repo}[/revision/{rev}] (the revision's commit; its files' sizes with ?blobs=true), GET
/api/models/{repo}/tree/{rev} (files with sizes) and HEAD/GET /{repo}/resolve/{rev}/{file} (X-Repo-Commit, ETag,
Content-Length, Range -> 206).

Private repositories answer 401 without `Authorization: Bearer <their token>` (as the Hub does for a private or a
missing one); every request is recorded with its headers. Modes: `reset_once` (a file's first GET sends half its
bytes, then drops the connection), `declared_sizes` (the listing lies: declares less than the body served),
`is_length_omitted` (no Content-Length: a body is ended by closing the connection), `is_range_ignored` (a Range
request gets the whole file, 200), `is_cdn_redirect` (resolve redirects to a CDN on another origin) and `stall`
(requests wait for an event, set when the test ends).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

__all__ = ["FakeHub", "FakeRepo", "SeenRequest", "fake_hub"]

DEFAULT_BRANCH = "main"


@dataclass
class FakeRepo:
    """A repository: its commits' files and its refs (branches and tags) -> commit."""

    commits: dict[str, dict[str, bytes]]
    refs: dict[str, str]
    token: str | None = None  # set: private, readable with this bearer token only
    declared_sizes: dict[str, int] = field(default_factory=dict)  # lie_sizes: what the tree says instead

    def resolve(self, revision: str) -> str | None:
        """The commit of a ref or a commit id (None when it names neither)."""
        return revision if revision in self.commits else self.refs.get(revision)


@dataclass(frozen=True)
class SeenRequest:
    """One request the fake Hub received."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    """The server's state: repositories, recorded requests and the reset-once mode (file names)."""

    url: str = ""
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[SeenRequest] = field(default_factory=list)
    reset_once: set[str] = field(default_factory=set)
    is_length_omitted: bool = False  # bodies without Content-Length, ended by closing the connection
    is_range_ignored: bool = False  # a Range request is answered 200 with the whole file
    is_cdn_redirect: bool = False  # resolve answers 302 to /cdn/... on another origin, as the Hub does
    stall: threading.Event | None = None  # set: every request waits for this event before it is answered

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, token: str | None = None) -> str:
        """A repository whose main branch holds `files` in one commit; returns the commit."""
        commit = commit_of(files)
        self.repos[repo_id] = FakeRepo(
            commits={commit: dict(files)}, refs={DEFAULT_BRANCH: commit}, token=token
        )
        return commit

    def push(self, repo_id: str, files: dict[str, bytes], *, ref: str = DEFAULT_BRANCH) -> str:
        """A new commit on `ref` (a branch or a tag) holding `files`; returns it."""
        commit = commit_of(files)
        repo = self.repos[repo_id]
        repo.commits[commit] = dict(files)
        repo.refs[ref] = commit
        return commit

    def seen(self, kind: str) -> list[SeenRequest]:
        """The recorded requests of one kind: "revision", "tree", "resolve" or "cdn"."""
        if kind == "revision":
            return [r for r in self.requests if "/tree/" not in r.path and r.path.startswith("/api/models/")]
        marker = {"tree": "/tree/", "resolve": "/resolve/", "cdn": "/cdn/"}[kind]
        return [r for r in self.requests if marker in r.path]

    def authorizations(self) -> list[str]:
        """Every Authorization header any request carried."""
        return [r.headers["authorization"] for r in self.requests if "authorization" in r.headers]


def commit_of(files: dict[str, bytes]) -> str:
    """A 40-hex commit id derived from the files (distinct contents, distinct commits)."""
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    return digest.hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def _dispatch(self, *, head: bool) -> None:
        path = urlsplit(self.path).path
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.hub.requests.append(SeenRequest(self.command, path, headers))
        if self.hub.stall is not None:
            self.hub.stall.wait()
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 4:  # model_info without a revision
            self._api(f"{parts[2]}/{parts[3]}", "revision", DEFAULT_BRANCH)
        elif parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            self._api(f"{parts[2]}/{parts[3]}", parts[4], unquote(parts[5]))
        elif len(parts) >= 5 and parts[0] == "cdn":
            self._cdn(f"{parts[1]}/{parts[2]}", parts[3], unquote("/".join(parts[4:])), head)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(f"{parts[0]}/{parts[1]}", unquote(parts[3]), unquote("/".join(parts[4:])), head)
        else:
            self._error(404, "EntryNotFound")

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}"):
            self._error(401, "RepoNotFound")  # the Hub says the same of a private and a missing repository
            return None
        return repo

    def _api(self, repo_id: str, kind: str, revision: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        commit = repo.resolve(revision)
        if commit is None:
            self._error(404, "RevisionNotFound")
            return
        files = repo.commits[commit]
        if kind == "revision":
            is_blobs = "blobs=" in (urlsplit(self.path).query or "").lower()
            siblings = [
                {"rfilename": name}
                | (_blob_fields(name, data, repo, lfs_digest="sha256") if is_blobs else {})
                for name, data in sorted(files.items())
            ]
            self._json({"id": repo_id, "sha": commit, "private": bool(repo.token), "siblings": siblings})
            return
        entries = [
            {"type": "file", "path": name} | _blob_fields(name, data, repo, lfs_digest="oid")
            for name, data in sorted(files.items())
        ]
        self._json(entries)

    def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        commit = repo.resolve(revision)
        data = repo.commits[commit].get(name) if commit else None
        if data is None or commit is None:
            self._error(404, "EntryNotFound")
            return
        if self.hub.is_cdn_redirect:
            self.send_response(302)
            self.send_header("X-Repo-Commit", commit)
            self.send_header(
                "Location", f"{self.hub.url.replace('127.0.0.1', 'localhost')}/cdn/{repo_id}/{commit}/{name}"
            )
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._serve_file(data, commit, name, head)

    def _cdn(self, repo_id: str, commit: str, name: str, head: bool) -> None:
        """The CDN a resolve redirects to: no authorization (the URL is the grant), no X-Repo-Commit."""
        data = self.hub.repos[repo_id].commits.get(commit, {}).get(name)
        if data is None:
            self._error(404, "EntryNotFound")
            return
        self._serve_file(data, None, name, head)

    def _serve_file(self, data: bytes, commit: str | None, name: str, head: bool) -> None:
        start = 0 if self.hub.is_range_ignored else _range_start(self.headers.get("Range"))
        body = data[start:]
        self.send_response(206 if start else 200)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")
        if self.hub.is_length_omitted:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if name in self.hub.reset_once:
            self.hub.reset_once.discard(name)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self._reset_connection()
            return
        self.wfile.write(body)

    def _reset_connection(self) -> None:
        """Drop the connection mid-body (a FIN, not an RST: an RST may discard bytes the client has not read
        yet, and the test needs them to arrive to see the resume start where they end)."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _json(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _blob_fields(name: str, data: bytes, repo: FakeRepo, *, lfs_digest: str) -> dict[str, object]:
    """A file's size (as the repository declares it: `declared_sizes` may lie), blob id and LFS pointer (its
    digest is `sha256` in a model's siblings and `oid` in a tree, as on the Hub)."""
    size = repo.declared_sizes.get(name, len(data))
    fields: dict[str, object] = {"size": size, "oid": hashlib.sha1(data).hexdigest()}
    fields["blobId"] = fields["oid"]
    if name.endswith(".safetensors"):
        fields["lfs"] = {lfs_digest: hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
    return fields


def _range_start(value: str | None) -> int:
    if not value or not value.startswith("bytes=") or not value.endswith("-"):
        return 0
    return int(value.removeprefix("bytes=").removesuffix("-"))


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    """A fake Hub on a free loopback port, serving in a thread until the test ends."""
    hub = FakeHub()
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # listening once constructed: no wait needed
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        if hub.stall is not None:
            hub.stall.set()  # release stalled handlers
        server.shutdown()
        server.server_close()
        thread.join()
