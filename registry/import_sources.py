"""Adapter imports: the locations a tenant may import from, with whose credentials, and reading one.

An import never uses the platform's own credentials on a location the tenant chose:
- `https://host/path/adapter.zip` (one archive: .zip, .tar.gz or .tar), e.g. a presigned S3 URL: fetched with no
  credentials at all (no proxy or .netrc from the environment), no redirects, and only from public addresses
  (registry/public_addresses.py; the connection goes to the address that was checked).
- `s3://bucket/folder` (the adapter's files) or `s3://bucket/key.zip|.tar.gz|.tar` with the tenant's own
  `S3Credentials` sent in the request: used for this one read, never stored, logged or echoed back. They are
  sent to the platform's S3 endpoint, or to an endpoint the tenant names (public addresses only).
- `s3://...` without credentials only from a bucket the operator allow-lists (settings.api.import_allowed_buckets):
  then, and only then, the platform's credentials read it.
- `hf://org/name[@revision]` from the operator's Hugging Face Hub (settings.api.import_hf_endpoint), with the
  tenant's own Hub token (`HubCredentials`) for a private or gated repository, else with no token at all:
  registry/hub_source.py (which files, which commit), registry/hub_download.py (pinned, resumable download).
The platform's own blob bucket is refused whatever the credentials (SourceNotAllowedError).

Any location that cannot be read (missing bucket or key, access denied, wrong credentials, an expired URL, an
unreachable or non-public host) raises the same SourceUnreadableError with the same message: a tenant learns
nothing about buckets, keys or hosts it cannot read, and no internal error text reaches it (only the error's
type is logged, with the location stripped of any query string). A readable source whose files are not a
valid adapter gets the usual AdapterValidationError. Reading stops at `max_bytes` (413, nothing kept); a Hub
import is also refused before its download when its declared weights pass the plan's remaining storage.

Residual risk, stated: boto3 resolves a tenant-named S3 endpoint itself, so a DNS answer that changes between
the check and boto3's connection could reach an address the check refused; presigned https URLs have no such
gap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from registry.archive import is_archive_name
from registry.blob_locations import parse_s3_uri
from registry.errors import InvalidRequestError, PermissionDeniedError, StorageQuotaError
from registry.hub_download import download_snapshot
from registry.hub_source import (
    HUB_FORM,
    HUB_SCHEME,
    HubCredentials,
    HubRepo,
    check_hub_sizes,
    parse_hub_uri,
    read_hub_snapshot,
)
from registry.import_reads import COPY_CHUNK_BYTES, ByteBudget, basename, read_s3
from registry.public_addresses import resolve_checked_address
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME, AdapterValidationError
from settings import Settings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
SOURCE_FORMS = (
    "give source as an https:// URL of one .zip/.tar.gz/.tar archive (a presigned S3 URL works), or as "
    f"s3://bucket/folder (holding {CONFIG_FILENAME} and {WEIGHTS_FILENAME}) or s3://bucket/key.zip|.tar.gz|.tar "
    f"with your own credentials, or {HUB_FORM} with your own hf_token for a private repository"
)
UNREADABLE_MESSAGE = (
    "the import source could not be read: check that the location exists, that a presigned URL has not "
    "expired, and that the credentials sent may read it (s3:GetObject, and s3:ListBucket for a folder; a "
    "Hub token with read access to the repository, whose gated terms it has accepted). The "
    "reason is never shown, so that nothing is revealed about locations you cannot read"
)


class SourceUnreadableError(InvalidRequestError):
    """The import location could not be read, for whatever reason (one message for every reason)."""

    code = "source_unreadable"

    def __init__(self) -> None:
        super().__init__(UNREADABLE_MESSAGE)


class SourceNotAllowedError(PermissionDeniedError):
    """The import location is one this tenant may not read this way (decided before anything is read)."""

    code = "source_not_allowed"


@dataclass(frozen=True)
class S3Credentials:
    """A tenant's own S3 credentials for one import (never stored; repr hides the secrets)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    region: str | None = None


SourceCredentials = S3Credentials | HubCredentials


@dataclass(frozen=True)
class ImportSource:
    """A parsed import location: an http(s) URL of one archive, an S3 bucket and key/folder, or a Hub repo."""

    url: httpx.URL | None = None
    bucket: str = ""
    key: str = ""
    hub: HubRepo | None = None

    @property
    def is_s3(self) -> bool:
        """True for an s3:// source."""
        return self.url is None and self.hub is None

    @property
    def redacted(self) -> str:
        """The location without query string or user info (a presigned URL's signature is a credential)."""
        if self.hub is not None:
            return self.hub.uri
        if self.url is None:
            return f"s3://{self.bucket}/{self.key}".rstrip("/")
        return str(self.url.copy_with(query=None, fragment=None, username=None, password=None))


@dataclass(frozen=True)
class ImportedFiles:
    """What an import read: the file names written, and the commit a Hub revision resolved to."""

    names: list[str]
    source_revision: str | None = None


def parse_import_source(source: str, settings: Settings) -> ImportSource:
    """Parse a tenant's `source`; InvalidRequestError (saying the accepted forms) when it is none of them."""
    if source.startswith(HUB_SCHEME):
        try:
            return ImportSource(hub=parse_hub_uri(source))
        except ValueError as exc:
            raise InvalidRequestError(f"{exc}; {SOURCE_FORMS}", code="invalid_source") from None
    if source.startswith("s3://"):
        try:
            bucket, key = parse_s3_uri(source)
        except ValueError as exc:
            raise InvalidRequestError(f"{exc}; {SOURCE_FORMS}", code="invalid_source") from None
        return ImportSource(bucket=bucket, key=key)
    url = _checked_url(source, settings, what="source")
    if not is_archive_name(url.path):
        raise InvalidRequestError(
            f"an {url.scheme}:// source is one archive, and {url.path!r} does not end in .zip, .tar.gz or .tar; "
            f"{SOURCE_FORMS}",
            code="invalid_source",
        )
    return ImportSource(url=url)


def check_import_allowed(
    source: ImportSource, credentials: SourceCredentials | None, settings: Settings
) -> None:
    """Refuse, before anything is read, a source this tenant may not read this way (see the module docstring)."""
    if source.hub is not None:
        _check_hub_allowed(credentials, settings)
        return
    if isinstance(credentials, HubCredentials):
        raise InvalidRequestError(
            "hf_token applies to hf:// sources only; send s3:// sources with credentials, https URLs with none",
            code="invalid_source",
        )
    if not source.is_s3:
        if credentials is not None:
            raise InvalidRequestError(
                "credentials apply to s3:// sources only; an https URL is fetched without credentials (presign "
                "it, or send s3://bucket/key with the credentials)",
                code="invalid_source",
            )
        return
    if source.bucket.lower() == (platform_bucket(settings) or "").lower():
        raise SourceNotAllowedError(
            f"s3://{source.bucket} is the platform's own blob bucket; it cannot be an import source. Upload the "
            "adapter's files, or import them from a bucket of yours"
        )
    if credentials is None and source.bucket not in settings.api.import_allowed_buckets:
        raise SourceNotAllowedError(
            f"importing from s3://{source.bucket} needs your own credentials: send credentials "
            "{access_key_id, secret_access_key, and optionally session_token, endpoint_url, region} with the "
            "import, or import a presigned https URL (the operator opens no bucket to imports without them)"
        )
    if credentials is not None and credentials.endpoint_url is not None:
        _checked_url(credentials.endpoint_url, settings, what="credentials.endpoint_url")


def _check_hub_allowed(credentials: SourceCredentials | None, settings: Settings) -> None:
    if not settings.api.is_import_hf_enabled:
        raise SourceNotAllowedError(
            "this platform does not import from the Hugging Face Hub; download the adapter's files and upload "
            "them, or import them from an https:// URL or s3:// location"
        )
    if credentials is not None and not isinstance(credentials, HubCredentials):
        raise InvalidRequestError(
            "credentials apply to s3:// sources only; send a private Hub repository's token as hf_token",
            code="invalid_source",
        )


def platform_bucket(settings: Settings) -> str | None:
    """The bucket of the platform's own blob store (None for a local directory store)."""
    location = settings.resolved_blob_store()
    return parse_s3_uri(location)[0] if location.startswith("s3://") else None


def read_import_source(
    source: ImportSource,
    credentials: SourceCredentials | None,
    settings: Settings,
    dest: Path,
    max_bytes: int,
    max_weights_bytes: int | None = None,
) -> ImportedFiles:
    """Write the source's adapter files (or its one archive) into `dest`; returns the file names written (and,
    for a Hub source, the commit read). `max_weights_bytes`: what the plan's storage quota leaves (None: no
    quota), checked against a Hub repository's declared weights before any download.

    Call check_import_allowed first. SourceUnreadableError for any location that cannot be read; the
    AdapterValidationError of check_upload_filenames or of the size limit, or the StorageQuotaError, for a
    readable one.
    """
    try:
        if source.hub is not None:
            hub_credentials = credentials if isinstance(credentials, HubCredentials) else None
            return _read_hub(
                source.hub,
                hub_credentials,
                settings.api.import_hf_endpoint,
                dest,
                max_bytes,
                max_weights_bytes,
            )
        s3_credentials = credentials if isinstance(credentials, S3Credentials) else None
        if source.is_s3:
            names = read_s3(
                source.bucket, source.key, _s3_client(s3_credentials, settings), dest, ByteBudget(max_bytes)
            )
            return ImportedFiles(names)
        return ImportedFiles([_read_url(source, settings, dest, ByteBudget(max_bytes))])
    except (AdapterValidationError, StorageQuotaError):  # readable, but the wrong files or too large: say so
        raise
    except Exception as exc:  # noqa: BLE001 - every reason a location cannot be read looks the same
        log.info("import source %s could not be read (%s)", source.redacted, type(exc).__name__)
        raise SourceUnreadableError() from None


# ---- URLs ------------------------------------------------------------------------------------------------


def _checked_url(value: str, settings: Settings, *, what: str) -> httpx.URL:
    """An https URL (http too where private networks are allowed) with a host and no user info."""
    schemes = ("https", "http") if settings.api.is_import_private_network_allowed else ("https",)
    try:
        url = httpx.URL(value)
    except (httpx.InvalidURL, TypeError):
        url = None
    if url is None or url.scheme not in schemes or not url.host:
        hint = SOURCE_FORMS if what == "source" else "give the S3 endpoint as https://host[:port]"
        raise InvalidRequestError(f"{what} is not an accepted URL; {hint}", code="invalid_source")
    if url.userinfo:
        raise InvalidRequestError(f"{what} must not contain a user name or password", code="invalid_source")
    return url


def _read_url(source: ImportSource, settings: Settings, dest: Path, budget: ByteBudget) -> str:
    """GET the archive with no credentials, connected to the checked address of its host."""
    url = source.url
    assert url is not None
    port = url.port or (443 if url.scheme == "https" else 80)
    address = resolve_checked_address(
        url.host, port, is_private_allowed=settings.api.is_import_private_network_allowed
    )
    headers = {"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"}
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    name = basename(url.path)
    with httpx.Client(trust_env=False, follow_redirects=False, timeout=timeout) as client:
        request = client.build_request(
            "GET", url.copy_with(host=address), headers=headers, extensions={"sni_hostname": url.host}
        )
        response = client.send(request, stream=True)
        try:
            if response.status_code != 200:
                raise OSError(f"HTTP {response.status_code}")
            budget.check_declared(int(response.headers.get("content-length") or 0))
            with open(dest / name, "wb") as out:
                for chunk in response.iter_raw(COPY_CHUNK_BYTES):
                    budget.spend(len(chunk))
                    out.write(chunk)
        finally:
            response.close()
    return name


# ---- the Hugging Face Hub --------------------------------------------------------------------------------


def _read_hub(
    repo: HubRepo,
    credentials: HubCredentials | None,
    endpoint: str,
    dest: Path,
    max_bytes: int,
    max_weights_bytes: int | None,
) -> ImportedFiles:
    """Resolve and list (metadata only), check the declared sizes, then download pinned to the commit."""
    snapshot = read_hub_snapshot(repo, credentials, endpoint)
    check_hub_sizes(snapshot, max_bytes, max_weights_bytes)
    names = download_snapshot(repo, snapshot, credentials, endpoint, dest)
    return ImportedFiles(names, source_revision=snapshot.commit)


# ---- S3 --------------------------------------------------------------------------------------------------


def _s3_client(credentials: S3Credentials | None, settings: Settings) -> Any:
    """A client with the tenant's credentials, or the platform's for an allow-listed bucket (no credentials)."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": 2},
    )
    if credentials is None:
        return boto3.client(
            "s3",
            endpoint_url=settings.storage.s3_endpoint_url,
            region_name=settings.storage.s3_region,
            config=config,
        )
    if credentials.endpoint_url is not None:
        url = httpx.URL(credentials.endpoint_url)
        resolve_checked_address(
            url.host,
            url.port or (443 if url.scheme == "https" else 80),
            is_private_allowed=settings.api.is_import_private_network_allowed,
        )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=credentials.endpoint_url or settings.storage.s3_endpoint_url,
        region_name=credentials.region or settings.storage.s3_region,
        aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key,
        aws_session_token=credentials.session_token,
        config=config,
    )
