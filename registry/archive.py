"""Safe extraction of an uploaded adapter archive (.zip, .tar.gz, .tgz, .tar) into a flat directory.

Only regular files with the allowed adapter file names are written; they may sit at the top level or in
one top-level folder. Absolute paths, "..", links, devices, too many members and too many uncompressed
bytes (counted while streaming, never trusting headers) are refused with an AdapterValidationError.
Extraction goes to a staging directory next to dest_dir and is moved in only when everything passed, so a
refused archive leaves no partial files behind.
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
    extract = _extractor_for(archive_path)
    dest_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest_dir.parent))
    try:
        state = _Extraction(staging, limits)
        extract(archive_path, state)
        check_upload_filenames(state.names)
        for name in state.written:
            os.replace(staging / name, dest_dir / name)
        return sorted(state.written)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fail(code: str, message: str) -> AdapterValidationError:
    return AdapterValidationError(code, message)


# ---------------------------------------------------------------------------------------------------------
# Format-independent member rules


@dataclass
class _Extraction:
    """Running state of one extraction: member count, bytes written, names, the single allowed folder."""

    staging: Path
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
                f"the archive expands to more than {self.limits.max_uncompressed_bytes} bytes; upload "
                "adapter_config.json and adapter_model.safetensors directly or a smaller adapter",
            )

    def reserve_bytes(self, num_bytes: int) -> None:
        """Count uncompressed bytes actually read against the limit."""
        self.check_room(num_bytes)
        self.num_bytes += num_bytes

    def write(self, name: str, source: IO[bytes]) -> None:
        """Stream one member to staging/name, counting bytes as they are decompressed."""
        with open(self.staging / name, "xb") as out:
            while chunk := source.read(COPY_CHUNK_BYTES):
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


def _extractor_for(path: Path) -> Callable[[Path, _Extraction], None]:
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
        with archive.open(info) as source:
            state.write(name, source)


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
    source = archive.extractfile(member)
    if source is None:
        raise _special_error(member.name)
    with source:
        state.write(name, source)
