"""Reading an import's bytes: the byte budget every import spends, bounded copies, and an S3 folder or archive
read with a client registry/import_sources.py chose (the tenant's credentials, or the platform's for an
allow-listed bucket)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from registry.archive import is_archive_name
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME, AdapterValidationError
from registry.validation.config import check_upload_filenames

COPY_CHUNK_BYTES = 1024 * 1024
MAX_LISTED_KEYS = 16  # a folder holds at most the adapter's files and a README


def read_s3(bucket: str, key: str, client: Any, dest: Path, budget: ByteBudget) -> list[str]:
    """The adapter's files of folder `key` (or the one archive `key`) of `bucket` into `dest`; their names."""
    if is_archive_name(key):
        name = basename(key)
        download_object(client, bucket, key, dest / name, budget)
        return [name]
    objects = list_folder(client, bucket, key)
    names = [basename(item["Key"]) for item in objects]
    if len(names) != 1 or not is_archive_name(names[0]):
        check_upload_filenames(names)  # the wrong set of files is refused before a byte is downloaded
    budget.check_declared(sum(int(item.get("Size", 0)) for item in objects))
    for item, name in zip(objects, names, strict=True):
        download_object(client, bucket, item["Key"], dest / name, budget)
    return names


def list_folder(client: Any, bucket: str, key: str) -> list[dict[str, Any]]:
    """The objects directly in the source folder (an empty or missing folder cannot be read)."""
    folder = f"{key}/" if key else ""
    page = client.list_objects_v2(Bucket=bucket, Prefix=folder, Delimiter="/", MaxKeys=MAX_LISTED_KEYS)
    objects = [item for item in page.get("Contents", []) if item["Key"] != folder]
    if not objects:
        raise FileNotFoundError("empty folder")
    if page.get("IsTruncated"):
        raise AdapterValidationError(
            "unexpected_file",
            f"the source folder holds more than {MAX_LISTED_KEYS} files; an adapter folder holds exactly "
            f"{CONFIG_FILENAME} and {WEIGHTS_FILENAME} (README.md is allowed and ignored)",
        )
    return objects


def download_object(client: Any, bucket: str, key: str, path: Path, budget: ByteBudget) -> None:
    """One object into `path`, spending `budget`."""
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        copy_bounded(body, path, budget)
    finally:
        body.close()


def basename(path: str) -> str:
    """The last component of a key or URL path."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def copy_bounded(src: IO[bytes], path: Path, budget: ByteBudget) -> None:
    """Copy `src` into `path`, spending `budget` (413 once it is exceeded)."""
    with open(path, "wb") as out:
        while chunk := src.read(COPY_CHUNK_BYTES):
            budget.spend(len(chunk))
            out.write(chunk)


class ByteBudget:
    """The bytes an import may still read; AdapterValidationError (413) as soon as it is exceeded."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0

    def check_declared(self, num_bytes: int) -> None:
        """Refuse before reading when the source declares more than the limit."""
        if num_bytes > self.max_bytes:
            raise self._too_large()

    def spend(self, num_bytes: int) -> None:
        """Count bytes read; refuse once past the limit."""
        self.num_bytes += num_bytes
        if self.num_bytes > self.max_bytes:
            raise self._too_large()

    def _too_large(self) -> AdapterValidationError:
        return AdapterValidationError(
            "upload_too_large",
            f"the import source holds more than {self.max_bytes} bytes; import a smaller adapter (lower rank, "
            "fewer target modules or fp16/bf16 weights) or ask the operator to raise LORAHOST_MAX_UPLOAD_BYTES",
        )
