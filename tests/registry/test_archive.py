"""Archive extraction: flat output, refusals leave nothing behind, sizes counted while streaming."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

from registry import archive as archive_module
from registry.archive import extract_archive, is_archive_name
from registry.validation import MAX_CONFIG_BYTES, AdapterValidationError, ValidationLimits
from tests.registry.malformed import MALFORMED_CASES, TIGHT_LIMIT_CASES, TIGHT_LIMITS
from tests.registry.upload_builders import (
    CONFIG,
    WEIGHTS,
    MalformedCase,
    lora_config,
    valid_files,
    write_raw_zip,
    write_tar,
    write_zip,
)

DEFAULT_LIMITS = ValidationLimits()
ARCHIVE_CASES = [
    c for c in MALFORMED_CASES if c.case_id.startswith(("zip_", "tar_", "tgz_", "not_an_archive"))
]


def _members(folder: str = "") -> list[tuple[str, bytes]]:
    return [(folder + name, content) for name, content in valid_files().items()]


def _leftovers(dest: Path) -> list[Path]:
    """Files in dest and staging directories next to it (a refusal of the check pass creates neither)."""
    if not dest.parent.exists():
        return []
    staged = [p for p in dest.parent.iterdir() if p.name.startswith(".extract-")]
    return (sorted(dest.iterdir()) if dest.exists() else []) + staged


@pytest.mark.parametrize("folder", ["", "my-adapter/", "./"])
def test_zip_extracts_flat_into_dest(folder: str, tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "a.zip", _members(folder))[0]
    names = extract_archive(archive, tmp_path / "out", DEFAULT_LIMITS)
    assert names == [CONFIG, WEIGHTS]
    assert (tmp_path / "out" / WEIGHTS).read_bytes() == valid_files()[WEIGHTS]


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz", ".tar"])
def test_tar_extracts_flat_and_skips_readme(suffix: str, tmp_path: Path) -> None:
    path = tmp_path / f"a{suffix}"
    members = [*_members("adapter/"), ("adapter/README.md", b"# hello")]
    if suffix == ".tar":
        with tarfile.open(path, "w") as archive:
            for name, content in members:
                info = tarfile.TarInfo(name)
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    else:
        write_tar(path, members)
    assert extract_archive(path, tmp_path / "out", DEFAULT_LIMITS) == [CONFIG, WEIGHTS]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [CONFIG, WEIGHTS]


def test_archive_without_suffix_is_sniffed_by_magic(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "upload.bin.tmp", _members())[0]
    assert extract_archive(archive, tmp_path / "out", DEFAULT_LIMITS) == [CONFIG, WEIGHTS]


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.rar").write_bytes(b"Rar!\x1a\x07\x00")
    with pytest.raises(AdapterValidationError, match="unsupported_archive"):
        extract_archive(tmp_path / "a.rar", tmp_path / "out", DEFAULT_LIMITS)


def test_is_archive_name() -> None:
    assert is_archive_name("A.ZIP") and is_archive_name("x.tar.gz") and is_archive_name("x.tgz")
    assert not is_archive_name(WEIGHTS) and not is_archive_name("x.gz")


@pytest.mark.parametrize("case", ARCHIVE_CASES, ids=lambda c: c.case_id)
def test_refused_archive_leaves_no_partial_files(case: MalformedCase, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    files = case.build(tmp_path / "in")
    dest = tmp_path / "work" / "adapter"
    if case.expected_code in {"empty_weights"}:  # archive is fine; the weights fail later
        extract_archive(files[0], dest, DEFAULT_LIMITS)
        return
    with pytest.raises(AdapterValidationError) as excinfo:
        extract_archive(files[0], dest, DEFAULT_LIMITS)
    assert excinfo.value.code == case.expected_code
    assert _leftovers(dest) == []


@pytest.mark.parametrize(
    "case", [c for c in TIGHT_LIMIT_CASES if "bomb" in c.case_id], ids=lambda c: c.case_id
)
def test_bombs_are_refused_under_tight_limits_without_leftovers(case: MalformedCase, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    dest = tmp_path / "work" / "adapter"
    with pytest.raises(AdapterValidationError, match="archive_too_large"):
        extract_archive(case.build(tmp_path / "in")[0], dest, TIGHT_LIMITS)
    assert _leftovers(dest) == []


def test_zip_bomb_with_a_lying_size_header_never_writes_past_the_declared_size(tmp_path: Path) -> None:
    """The header claims 1 KiB; the stream would inflate to 64 MiB. Refused, nothing written."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = compressor.compress(b"\0" * (64 << 20)) + compressor.flush()
    config = lora_config()
    path = tmp_path / "bomb.zip"
    write_raw_zip(path, [(CONFIG.encode(), str(config).encode(), 0, None), (WEIGHTS.encode(), data, 8, 1024)])
    dest = tmp_path / "out"
    with pytest.raises(AdapterValidationError) as excinfo:
        extract_archive(path, dest, TIGHT_LIMITS)
    assert excinfo.value.code in {"corrupt_archive", "archive_too_large"}
    assert _leftovers(dest) == []


def _archive_of(kind: str, path: Path, members: list[tuple[str, bytes]]) -> Path:
    if kind == "zip":
        return write_zip(path.with_suffix(".zip"), members)[0]
    if kind == "tgz":
        return write_tar(path.with_suffix(".tgz"), members)[0]
    with tarfile.open(path.with_suffix(".tar"), "w") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return path.with_suffix(".tar")


class _CountingSource(io.BytesIO):
    """A member stream that counts the bytes read from it."""

    num_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.num_read += len(chunk)
        return chunk


@pytest.mark.parametrize("kind", ["zip", "tgz", "tar"])
def test_member_declaring_more_than_its_limit_is_refused_before_anything_is_written(
    kind: str, tmp_path: Path
) -> None:
    """Weights of 128 KiB under max_adapter_bytes = 64 KiB, well within max_uncompressed_bytes: refused on
    the declared size, before any directory or file is created."""
    limits = ValidationLimits(max_adapter_bytes=64 * 1024, max_uncompressed_bytes=64 << 20)
    path = _archive_of(
        kind, tmp_path / "a", [(CONFIG, json.dumps(lora_config()).encode()), (WEIGHTS, b"\0" * (128 * 1024))]
    )
    with pytest.raises(AdapterValidationError) as excinfo:
        extract_archive(path, tmp_path / "work" / "adapter", limits)
    assert excinfo.value.code == "archive_member_too_large"
    assert f"larger than {64 * 1024} bytes" in excinfo.value.message
    assert "LORAHOST_MAX_ADAPTER_BYTES" in excinfo.value.message
    assert not (tmp_path / "work").exists()


def test_config_declaring_more_than_its_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = _archive_of("zip", tmp_path / "a", [(CONFIG, b" " * (MAX_CONFIG_BYTES + 1)), _members()[1]])
    with pytest.raises(AdapterValidationError, match="archive_member_too_large"):
        extract_archive(path, tmp_path / "work" / "adapter", DEFAULT_LIMITS)
    assert not (tmp_path / "work").exists()


def test_tar_declared_total_over_the_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Every member fits its own limit; the sum of the declared sizes does not. A tar is read as a stream:
    the check pass reads every header first, so not even the first member is written."""
    weights = valid_files()[WEIGHTS]
    limits = ValidationLimits(max_uncompressed_bytes=len(weights) + 100)
    path = write_tar(tmp_path / "a.tgz", [(CONFIG, b" " * 90), ("README.md", b"x" * 50), (WEIGHTS, weights)])[
        0
    ]
    with pytest.raises(AdapterValidationError, match="archive_too_large") as excinfo:
        extract_archive(path, tmp_path / "work" / "adapter", limits)
    assert not (tmp_path / "work").exists()
    assert "LORAHOST_MAX_UNCOMPRESSED_BYTES" in excinfo.value.message


def test_extraction_stops_a_member_at_its_limit_when_the_stream_outgrows_its_header(tmp_path: Path) -> None:
    """A member whose header declares 1 KiB but whose stream yields 4 MiB: the byte counter stops it at the
    member's limit (64 KiB), whatever the header said, and at most the limit was written."""
    staging = tmp_path / "staging"
    staging.mkdir()
    limits = ValidationLimits(max_adapter_bytes=64 * 1024, max_uncompressed_bytes=1 << 30)
    state = archive_module._Extraction(staging, limits)
    source = _CountingSource(b"\0" * (4 << 20))
    with pytest.raises(AdapterValidationError, match="archive_member_too_large"):
        state.write(WEIGHTS, 1024, lambda: source)
    assert (staging / WEIGHTS).stat().st_size <= 64 * 1024
    assert source.num_read <= (64 * 1024) + archive_module.COPY_CHUNK_BYTES  # stopped reading too


def test_tar_whose_header_understates_a_member_never_writes_past_the_declared_size(tmp_path: Path) -> None:
    """The weights header says 1 KiB and 4 MiB of data follow: tarfile reads only the declared 1 KiB, the rest
    is not a tar header and ends the archive; the weights are 1 KiB (validation refuses them later)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, content in [(CONFIG, json.dumps(lora_config()).encode()), (WEIGHTS, b"\x01" * 1024)]:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    body = raw.getvalue().rstrip(b"\0")  # drop the end-of-archive blocks, then append the hidden data
    path = tmp_path / "lie.tar"
    path.write_bytes(body + b"\0" * (-len(body) % 512) + b"\x01" * (4 << 20))
    dest = tmp_path / "work" / "adapter"
    assert extract_archive(path, dest, ValidationLimits(max_adapter_bytes=64 * 1024)) == [CONFIG, WEIGHTS]
    assert (dest / WEIGHTS).stat().st_size == 1024


def test_tar_member_sizes_accumulate_against_the_limit(tmp_path: Path) -> None:
    """Each member fits; together they pass the limit, which is caught before the third is written."""
    limits = ValidationLimits(max_uncompressed_bytes=valid_files()[WEIGHTS].__len__() + 100)
    path = write_tar(tmp_path / "a.tgz", [(CONFIG, b" " * 90), ("README.md", b"x" * 50), *_members()[1:]])[0]
    with pytest.raises(AdapterValidationError, match="archive_too_large"):
        extract_archive(path, tmp_path / "out", limits)
    assert _leftovers(tmp_path / "out") == []


def test_zip_with_many_central_directory_entries_is_refused_before_parsing(tmp_path: Path) -> None:
    members = [(f"junk/{i}", b"") for i in range(200)]
    path = write_zip(tmp_path / "many.zip", members)[0]
    with pytest.raises(AdapterValidationError, match="too_many_archive_members"):
        extract_archive(path, tmp_path / "out", DEFAULT_LIMITS)


def test_tar_with_many_members_is_refused(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("adapter")
    folder.type = tarfile.DIRTYPE
    path = write_tar(tmp_path / "many.tgz", [folder] * 9 + _members("adapter/"))[0]
    with pytest.raises(AdapterValidationError, match="too_many_archive_members"):
        extract_archive(path, tmp_path / "out", DEFAULT_LIMITS)


@pytest.mark.parametrize(
    "name", ["C:/adapter_config.json", "a\\..\\adapter_config.json", "/adapter_config.json"]
)
def test_windows_and_absolute_paths_are_refused(name: str, tmp_path: Path) -> None:
    path = write_zip(tmp_path / "a.zip", [(name, b"{}"), _members()[1]])[0]
    with pytest.raises(AdapterValidationError, match="unsafe_archive_path"):
        extract_archive(path, tmp_path / "out", DEFAULT_LIMITS)


def test_encrypted_zip_member_is_refused(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "a.zip", _members())[0]
    raw = bytearray(path.read_bytes())
    raw[6] |= 1  # general-purpose flag bit 0 (encrypted) in the first local header...
    central = raw.find(b"PK\x01\x02")
    raw[central + 8] |= 1  # ...and in its central directory entry
    path.write_bytes(bytes(raw))
    with pytest.raises(AdapterValidationError, match="unsupported_archive"):
        extract_archive(path, tmp_path / "out", DEFAULT_LIMITS)


def test_truncated_tar_is_refused_as_corrupt(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "a.tgz", _members())[0]
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(AdapterValidationError, match="corrupt_archive"):
        extract_archive(path, tmp_path / "out", DEFAULT_LIMITS)
    assert _leftovers(tmp_path / "out") == []


def test_corrupt_zip_data_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in _members():
            archive.writestr(name, content)
    raw = bytearray(path.read_bytes())
    start = raw.find(WEIGHTS.encode()) + len(WEIGHTS) + 10  # inside the first member's compressed data
    raw[start : start + 16] = b"\xff" * 16
    path.write_bytes(bytes(raw))
    with pytest.raises(AdapterValidationError, match="corrupt_archive"):
        extract_archive(path, tmp_path / "out", DEFAULT_LIMITS)
