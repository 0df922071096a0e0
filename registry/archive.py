"""Safe extraction of an uploaded adapter archive (.zip, .tar.gz, .tgz, .tar) into a flat directory.

Only regular files with the allowed adapter file names are written; they may sit at the top level or in
one top-level folder. Absolute paths, "..", links, devices, too many members and too many bytes are refused
with an AdapterValidationError.

Two passes. The check pass reads only the headers (zip: the central directory; tar: each member's header,
skipping its data) and applies every rule to the declared sizes: each member within its own limit
(`max_member_bytes`: adapter_model.safetensors max_adapter_bytes, adapter_config.json and README.md
MAX_CONFIG_BYTES) and all of them within max_uncompressed_bytes; nothing is written to disk before it has
passed. The extraction pass then streams each member to a staging directory next to dest_dir, counting the
bytes actually decompressed against the same limits, so it stops at the limit even when a header lies
(zipfile and tarfile themselves also stop reading a member at its declared size). The staging directory is
moved in only when everything passed, so a refused archive leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

from registry.validation import (
    IGNORED_FILENAMES,
    MAX_CONFIG_BYTES,
    WEIGHTS_FILENAME,
    AdapterValidationError,
    ValidationLimits,
    check_filenames_allowed,
    check_upload_filenames,
)

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
COPY_CHUNK_BYTES = 1024 * 1024
_JUNK_DIRS = frozenset({"__MACOSX"})  # macOS Finder adds these; never extracted
_DRIVE = re.compile(r"^[A-Za-z]:")


def is_archive_name(name: str) -> bool:
    """True when an uploaded file name looks like a supported archive."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def extract_archive(archive_path: Path, dest_dir: Path, limits: ValidationLimits) -> list[str]:
    """Extract an adapter archive flat into dest_dir; returns the written file names, sorted.

    README.md is accepted and skipped. Raises AdapterValidationError; on error dest_dir gets no files.
    """
    archive_path, dest_dir = Path(archive_path), Path(dest_dir)
    read_archive = _reader_for(archive_path)
    checked = _Extraction(None, limits)  # check pass: headers and declared sizes, nothing written
    read_archive(archive_path, checked)
    check_upload_filenames(checked.names)
    dest_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest_dir.parent))
    try:
        state = _Extraction(staging, limits)
        read_archive(archive_path, state)
        check_upload_filenames(state.names)
        for name in state.written:
            os.replace(staging / name, dest_dir / name)
        return sorted(state.written)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fail(code: str, message: str) -> AdapterValidationError:
    return AdapterValidationError(code, message)


def max_member_bytes(name: str, limits: ValidationLimits) -> int:
    """The most bytes one adapter file may have: the weights max_adapter_bytes, any other MAX_CONFIG_BYTES."""
    return limits.max_adapter_bytes if name == WEIGHTS_FILENAME else MAX_CONFIG_BYTES


def check_member_size(name: str, num_bytes: int, limits: ValidationLimits) -> None:
    """Refuse (413) an adapter file of more than `max_member_bytes` (declared or actually read)."""
    limit = max_member_bytes(name, limits)
    if num_bytes > limit:
        setting = "LORAHOST_MAX_ADAPTER_BYTES" if name == WEIGHTS_FILENAME else "a fixed limit"
        raise _fail(
            "archive_member_too_large",
            f"{name} in the archive is larger than {limit} bytes (the limit for {name}, {setting}); upload a "
            "smaller adapter (lower rank, fewer target modules or fp16/bf16 weights)",
        )


# ---------------------------------------------------------------------------------------------------------
# Format-independent member rules


@dataclass
class _Extraction:
    """Running state of one pass over an archive: member count, bytes, names, the single allowed folder.

    `staging` None is the check pass: members are checked and their declared sizes counted, nothing is read
    or written.
    """

    staging: Path | None
    limits: ValidationLimits
    num_members: int = 0
    num_entries: int = 0
    num_bytes: int = 0
    folder: str | None = None
    names: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)

    def count_entry(self) -> None:
        """Every entry, junk included, counts against a hard cap (bounds work on crafted archives)."""
        self.num_entries += 1
        if self.num_entries > _max_entries(self.limits):
            raise _too_many_members(self.limits)

    def add_member(self, raw_name: str, is_dir: bool) -> str | None:
        """Check one entry's path; returns the flat file name to write, or None to skip it."""
        if not _counts_as_member(raw_name):
            return None
        parts = _safe_parts(raw_name)
        self.num_members += 1
        if self.num_members > self.limits.max_archive_members:
            raise _too_many_members(self.limits)
        if is_dir:
            self._use_folder(parts[0] if len(parts) == 1 else None, raw_name)
            return None
        if len(parts) > 2:
            raise _layout_error(raw_name)
        self._use_folder(parts[0] if len(parts) == 2 else "", raw_name)
        name = parts[-1]
        check_filenames_allowed([*self.names, name])
        self.names.append(name)
        return None if name in IGNORED_FILENAMES else name

    def _use_folder(self, folder: str | None, raw_name: str) -> None:
        """All entries sit at the top level (folder "") or all in the same one folder; None = nested."""
        if folder is None or self.folder not in (None, folder):
            raise _layout_error(raw_name)
        self.folder = folder

    def check_room(self, num_bytes: int) -> None:
        """Refuse if num_bytes more uncompressed bytes would pass the limit (counts nothing)."""
        if self.num_bytes + num_bytes > self.limits.max_uncompressed_bytes:
            raise _fail(
                "archive_too_large",
                f"the archive expands to more than {self.limits.max_uncompressed_bytes} bytes (the limit, "
                "LORAHOST_MAX_UNCOMPRESSED_BYTES); upload adapter_config.json and adapter_model.safetensors "
                "directly or a smaller adapter",
            )

    def reserve_bytes(self, num_bytes: int) -> None:
        """Count uncompressed bytes actually read against the limit."""
        self.check_room(num_bytes)
        self.num_bytes += num_bytes

    def write(self, name: str, declared_bytes: int, open_source: Callable[[], IO[bytes]]) -> None:
        """Check the member's declared size; then (extraction pass) stream it to staging/name, counting the
        bytes actually decompressed against the member's and the archive's limits."""
        check_member_size(name, declared_bytes, self.limits)
        if self.staging is None:
            self.reserve_bytes(declared_bytes)
            return
        num_bytes = 0
        with open_source() as source, open(self.staging / name, "xb") as out:
            while chunk := source.read(COPY_CHUNK_BYTES):
                num_bytes += len(chunk)
                check_member_size(name, num_bytes, self.limits)  # the header may lie
                self.reserve_bytes(len(chunk))
                out.write(chunk)
        self.written.append(name)


def _safe_parts(raw_name: str) -> list[str]:
    name = raw_name.replace("\\", "/")
    if "\x00" in name or name.startswith("/") or _DRIVE.match(name):
        raise _fail(
            "unsafe_archive_path",
            f"archive member {raw_name!r} has an absolute path; archive the "
            "adapter files with relative names",
        )
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _fail(
            "unsafe_archive_path",
            f'archive member {raw_name!r} points outside the archive (".."); '
            "archive the adapter files with plain relative names",
        )
    return parts


def _max_entries(limits: ValidationLimits) -> int:
    """Hard cap on entries of any kind (junk and folders included)."""
    return 4 * limits.max_archive_members + 16


def _counts_as_member(raw_name: str) -> bool:
    parts = _safe_parts(raw_name)
    return bool(parts) and not _is_junk(parts)


def _is_junk(parts: list[str]) -> bool:
    return parts[0] in _JUNK_DIRS or parts[-1] == ".DS_Store" or parts[-1].startswith("._")


def _layout_error(raw_name: str) -> AdapterValidationError:
    return _fail(
        "invalid_archive_layout",
        f"archive member {raw_name!r}: the adapter files must sit at the top "
        "of the archive or together in one top-level folder",
    )


def _too_many_members(limits: ValidationLimits) -> AdapterValidationError:
    return _fail(
        "too_many_archive_members",
        f"the archive has more than {limits.max_archive_members} entries; "
        "it should hold only adapter_config.json and adapter_model.safetensors",
    )


def _link_error(raw_name: str) -> AdapterValidationError:
    return _fail(
        "archive_link_not_allowed",
        f"archive member {raw_name!r} is a symbolic or hard link; archive the real files instead",
    )


def _special_error(raw_name: str) -> AdapterValidationError:
    return _fail(
        "unsupported_archive_member",
        f"archive member {raw_name!r} is not a regular file (device, "
        "FIFO, sparse or socket); archive only the adapter files",
    )


# ---------------------------------------------------------------------------------------------------------
# Formats


def _reader_for(path: Path) -> Callable[[Path, _Extraction], None]:
    name = path.name.lower()
    if name.endswith(".zip"):
        return _extract_zip
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        return _extract_tar
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return _extract_zip
    if magic.startswith(b"\x1f\x8b"):
        return _extract_tar
    raise _fail(
        "unsupported_archive",
        f"{path.name!r} is not a supported archive; upload a .zip, .tar.gz or "
        ".tgz, or the two adapter files directly",
    )


@contextmanager
def _corrupt_archive_errors() -> Iterator[None]:
    try:
        yield
    except AdapterValidationError:
        raise
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        tarfile.TarError,
        EOFError,
        zlib.error,
        OSError,
        ValueError,
        NotImplementedError,
        RuntimeError,
        KeyError,
    ) as exc:
        raise _fail(
            "corrupt_archive", f"the archive could not be read ({exc}); re-create it with zip or tar -czf"
        ) from exc


def _extract_zip(path: Path, state: _Extraction) -> None:
    with _corrupt_archive_errors(), open(path, "rb") as f:
        _check_zip_entry_count(f, state.limits)
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
            state.check_room(
                sum(info.file_size for info in infos)
            )  # declared sizes; real bytes counted later
            if (
                sum(1 for info in infos if _counts_as_member(info.filename))
                > state.limits.max_archive_members
            ):
                raise _too_many_members(state.limits)
            for info in infos:
                _extract_zip_member(archive, info, state)


def _check_zip_entry_count(f: BinaryIO, limits: ValidationLimits) -> None:
    """Read the end-of-central-directory entry count before zipfile parses every entry."""
    end_record = zipfile._EndRecData(f)  # type: ignore[attr-defined]  # private but stable since py2
    if end_record is None:
        raise _fail("corrupt_archive", "the file is not a valid zip archive; re-create it with zip")
    num_entries = end_record[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]
    if num_entries > _max_entries(limits):
        raise _too_many_members(limits)
    f.seek(0)


def _extract_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, state: _Extraction) -> None:
    state.count_entry()
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        _safe_parts(info.filename)
        raise _link_error(info.filename)
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise _special_error(info.filename)
    if info.flag_bits & 0x1:
        raise _fail(
            "unsupported_archive",
            f"archive member {info.filename!r} is encrypted; upload an unencrypted archive",
        )
    name = state.add_member(info.filename, info.is_dir())
    if name is not None:
        state.write(name, info.file_size, lambda: archive.open(info))


def _extract_tar(path: Path, state: _Extraction) -> None:
    with _corrupt_archive_errors(), open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as archive:
        for member in archive:  # stream mode: one sequential pass, no seeking, no index kept
            _extract_tar_member(archive, member, state)


def _extract_tar_member(archive: tarfile.TarFile, member: tarfile.TarInfo, state: _Extraction) -> None:
    state.count_entry()
    if member.issym() or member.islnk():
        _safe_parts(member.name)
        raise _link_error(member.name)
    if not (member.isreg() or member.isdir()) or member.issparse():
        raise _special_error(member.name)
    state.check_room(member.size)  # declared size: a huge member is refused before inflating it
    name = state.add_member(member.name, member.isdir())
    if name is None:
        state.reserve_bytes(member.size)  # skipped data is still decompressed by the stream
        return
    state.write(name, member.size, lambda: _tar_member_source(archive, member))


def _tar_member_source(archive: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    source = archive.extractfile(member)
    if source is None:
        raise _special_error(member.name)
    return source
