"""Hugging Face Hub imports, `hf://org/name[@revision]`: which repository and commit, and which of its files.

- The Hub is the operator's (settings.api.import_hf_endpoint, a mirror speaking the Hub's file API works);
  a tenant names a repository on it, never a host. The environment's HF_ENDPOINT, HF_TOKEN and stored token
  files are never read: huggingface_hub is given the endpoint, and `token=False` when the tenant sent none.
- A private or gated repository is read with the tenant's own Hub token (`HubCredentials`), used for this
  one import and never stored, logged or echoed back.
- Before a byte of a file is downloaded: the revision asked for (a branch, a tag or a commit; default the
  repository's default branch) is resolved to its 40-hex commit and the repository's top-level files are
  listed with their sizes at that commit (one `model_info(files_metadata=True)` call, with a timeout), adapter_config.json and adapter_model.safetensors are required
  (a pickle-only adapter is refused with the reason; README.md, .gitattributes and the rest are ignored),
  and the declared sizes are checked against the upload limit and the plan's remaining storage
  (`check_hub_sizes`). The download itself (registry/hub_download.py) is pinned to that commit, so a branch
  that moves during an import cannot mix two versions, and is cut off past each file's declared size.

Any Hub failure that could reveal whether a repository exists (404, 401, 403, gated, a revision that does not
exist) becomes the caller's one generic unreadable-source error (registry/import_sources.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from registry.errors import StorageQuotaError
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME, AdapterValidationError
from registry.validation.config import check_filenames_allowed, check_upload_filenames

HUB_SCHEME = "hf://"
HUB_FORM = "hf://org/name or hf://org/name@revision (a branch, a tag or a 40-hex commit)"
METADATA_TIMEOUT_S = 30.0
MAX_REPO_ID_CHARS = 96  # the Hub's limit (huggingface_hub validate_repo_id)
MAX_REVISION_CHARS = 200
ADAPTER_FILES = (CONFIG_FILENAME, WEIGHTS_FILENAME)
PICKLE_WEIGHTS = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth", "adapter_model.ckpt")

_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_REVISION = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_./-]*[A-Za-z0-9_.-])?")
COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubRepo:
    """A Hub model repository and the revision a tenant asked for (None: the default branch)."""

    repo_id: str
    revision: str | None = None

    @property
    def uri(self) -> str:
        """The source as the tenant gave it (no credentials in it): recorded as the version's source_uri."""
        return f"{HUB_SCHEME}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class HubCredentials:
    """A tenant's own Hub access token for one import (never stored; repr hides it)."""

    token: str = field(repr=False)


@dataclass(frozen=True)
class HubFile:
    """One file of the repository at the resolved commit and the size the Hub declares for it."""

    name: str
    num_bytes: int


@dataclass(frozen=True)
class HubSnapshot:
    """The revision resolved to its commit, and the adapter's files at that commit."""

    commit: str
    files: tuple[HubFile, ...]

    @property
    def num_bytes(self) -> int:
        """The declared size of every file to download."""
        return sum(f.num_bytes for f in self.files)

    def declared_bytes(self, name: str) -> int:
        """The declared size of the file `name`."""
        return next(f.num_bytes for f in self.files if f.name == name)


def parse_hub_uri(source: str) -> HubRepo:
    """`hf://org/name[@revision]` -> HubRepo; ValueError saying what is wrong (the caller adds the forms)."""
    rest = source.removeprefix(HUB_SCHEME)
    repo_id, has_revision, revision = rest.partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) for p in parts):
        raise ValueError(
            f"{repo_id!r} is not a Hub repository id: org/name, each of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter, digit or '_'"
        )
    if len(repo_id) > MAX_REPO_ID_CHARS or "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        raise ValueError(
            f"{repo_id!r} is not a Hub repository id: at most {MAX_REPO_ID_CHARS} characters, no '--' or '..', "
            "not ending in .git"
        )
    if has_revision and not _is_revision(revision):
        raise ValueError(
            f"{revision!r} is not a revision: give a branch, a tag or a 40-hex commit after '@' (letters, digits, "
            "'-', '_', '.', '/'; no '..' or '//')"
        )
    return HubRepo(repo_id=repo_id, revision=revision if has_revision else None)


def _is_revision(revision: str) -> bool:
    return (
        len(revision) <= MAX_REVISION_CHARS
        and _REVISION.fullmatch(revision) is not None
        and ".." not in revision
        and "//" not in revision
        and not revision.endswith(".lock")
    )


def read_hub_snapshot(repo: HubRepo, credentials: HubCredentials | None, endpoint: str) -> HubSnapshot:
    """Resolve the revision to its commit and list the adapter's files at that commit (metadata only: no
    file is downloaded). Hub errors propagate as they are (the caller makes them one generic error); the
    AdapterValidationError of a readable repository without the adapter's files says what is missing."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=False, library_name="lorahost")
    token: str | bool = credentials.token if credentials is not None else False  # False: never the env's
    # One call answers the commit and every file's size at that commit (files_metadata: the Hub's `blobs`), so
    # the two cannot disagree, and it takes a timeout (list_repo_tree and get_paths_info take none, and
    # huggingface_hub's shared client has none: a Hub that stops answering would hold the import forever).
    info = api.model_info(
        repo.repo_id, revision=repo.revision, files_metadata=True, token=token, timeout=METADATA_TIMEOUT_S
    )
    commit = info.sha or ""
    if COMMIT.fullmatch(commit) is None:
        raise OSError("the Hub answered no commit for the revision")
    if repo.revision is not None and COMMIT.fullmatch(repo.revision) and repo.revision != commit:
        raise OSError("the Hub resolved a commit to another commit")
    sizes = {
        s.rfilename: s.lfs.size if s.lfs is not None else s.size
        for s in info.siblings or []
        if "/" not in s.rfilename  # the top level
    }
    return HubSnapshot(commit=commit, files=adapter_files(sizes))


def adapter_files(sizes: dict[str, int | None]) -> tuple[HubFile, ...]:
    """The adapter's two files among a repository's top-level files (name -> declared size); the rest is
    ignored. AdapterValidationError naming what is missing, or the pickle that is there instead."""
    if WEIGHTS_FILENAME not in sizes:
        check_filenames_allowed([name for name in PICKLE_WEIGHTS if name in sizes])  # pickle_not_allowed
    check_upload_filenames([name for name in ADAPTER_FILES if name in sizes])
    declared = [(name, sizes[name]) for name in ADAPTER_FILES]
    if any(size is None for _, size in declared):
        raise OSError("the Hub declared no size for an adapter file")  # it could not be bounded
    return tuple(HubFile(name, int(size or 0)) for name, size in declared)


def check_hub_sizes(snapshot: HubSnapshot, max_bytes: int, max_weights_bytes: int | None) -> None:
    """Refuse, before a byte is downloaded, a snapshot larger than the upload limit (413 upload_too_large) or
    whose weights pass what the plan's storage quota leaves (`max_weights_bytes`; None: no quota)."""
    if snapshot.num_bytes > max_bytes:
        raise AdapterValidationError(
            "upload_too_large",
            f"the import source holds more than {max_bytes} bytes; import a smaller adapter (lower rank, fewer "
            "target modules or fp16/bf16 weights) or ask the operator to raise LORAHOST_MAX_UPLOAD_BYTES",
        )
    num_weights = snapshot.declared_bytes(WEIGHTS_FILENAME)
    if max_weights_bytes is not None and num_weights > max_weights_bytes:
        raise StorageQuotaError(
            f"this adapter's weights ({num_weights} bytes) are larger than the {max_weights_bytes} bytes your "
            "plan's max_stored_bytes leaves; delete adapters you no longer need, import a smaller adapter, or "
            "ask the operator for a plan with more"
        )
