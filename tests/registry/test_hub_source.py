"""Hugging Face Hub imports (issue 39 item 3) against a local server speaking the Hub's file API: hf:// forms,
the commit resolved and pinned, the tenant's token only (never the platform's HF_TOKEN), sizes and the plan's
storage checked before a byte is downloaded, resumed transfers, lying servers cut off, one generic error."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from registry import hub_download, hub_source, import_sources
from registry.errors import InvalidRequestError, StorageQuotaError
from registry.hub_source import HubCredentials, HubRepo
from registry.import_sources import (
    UNREADABLE_MESSAGE,
    ImportedFiles,
    S3Credentials,
    SourceNotAllowedError,
    SourceUnreadableError,
)
from registry.validation import CONFIG_FILENAME, WEIGHTS_FILENAME, AdapterValidationError
from settings import Settings
from tests.registry.fake_hub import *  # the fake_hub fixture
from tests.registry.fake_hub import FakeHub

HUB_TOKEN = "hf_tenant_token_never_shown"
PLATFORM_TOKEN = "hf_platform_token_never_sent"
CONFIG = b'{"peft_type": "LORA", "r": 8}'
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB: more than one download chunk
FILES = {CONFIG_FILENAME: CONFIG, WEIGHTS_FILENAME: WEIGHTS, "README.md": b"# card", ".gitattributes": b"*"}


def _settings(tmp_path: Path, hub: FakeHub, **overrides: object) -> Settings:
    return Settings(**({"data_dir": tmp_path, "import_hf_endpoint": hub.url} | overrides))


def _read(
    settings: Settings,
    source: str,
    dest: Path,
    credentials: HubCredentials | S3Credentials | None = None,
    max_bytes: int = 10**9,
    max_weights_bytes: int | None = None,
) -> ImportedFiles:
    parsed = import_sources.parse_import_source(source, settings)
    import_sources.check_import_allowed(parsed, credentials, settings)
    dest.mkdir(exist_ok=True)
    return import_sources.read_import_source(
        parsed, credentials, settings, dest, max_bytes, max_weights_bytes
    )


def _assert_adapter_read(dest: Path, files: dict[str, bytes] = FILES) -> None:
    assert sorted(p.name for p in dest.iterdir()) == sorted([CONFIG_FILENAME, WEIGHTS_FILENAME])
    assert (dest / CONFIG_FILENAME).read_bytes() == files[CONFIG_FILENAME]
    assert (dest / WEIGHTS_FILENAME).read_bytes() == files[WEIGHTS_FILENAME]


# ---- the source's form ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "repo_id", "revision"),
    [
        ("hf://org/name", "org/name", None),
        ("hf://Org-1/my_lora.v2@main", "Org-1/my_lora.v2", "main"),
        ("hf://org/name@v1.0", "org/name", "v1.0"),
        ("hf://org/name@refs/pr/1", "org/name", "refs/pr/1"),
        ("hf://org/name@" + "a" * 40, "org/name", "a" * 40),
    ],
)
def test_hub_sources_parse_to_repo_and_revision(tmp_path, source, repo_id, revision) -> None:
    parsed = import_sources.parse_import_source(source, Settings(data_dir=tmp_path))
    assert parsed.hub == HubRepo(repo_id, revision) and not parsed.is_s3
    assert parsed.redacted == source


@pytest.mark.parametrize(
    "source",
    [
        "hf://name-only",
        "hf://org/name/sub",
        "hf://-org/name",
        "hf://org/name.git",
        "hf://org/na--me",
        "hf://org/na..me",
        "hf:///name",
        "hf://org/name@",
        "hf://org/name@../main",
        "hf://org/name@a b",
        "hf://user:pass@host/name",
        "hf://org/" + "n" * 100,
    ],
)
def test_malformed_hub_sources_say_the_accepted_forms(tmp_path, source) -> None:
    with pytest.raises(InvalidRequestError, match=r"hf://org/name@revision") as err:
        import_sources.parse_import_source(source, Settings(data_dir=tmp_path))
    assert err.value.code == "invalid_source"


def test_hub_imports_can_be_turned_off_and_credentials_keep_to_their_source(tmp_path, fake_hub) -> None:
    off = _settings(tmp_path, fake_hub, is_import_hf_enabled=False)
    with pytest.raises(SourceNotAllowedError, match="does not import from the Hugging Face Hub"):
        _read(off, "hf://org/name", tmp_path / "in")
    settings = _settings(tmp_path, fake_hub)
    s3_credentials = S3Credentials(access_key_id="k", secret_access_key="s")
    with pytest.raises(InvalidRequestError, match="hf_token"):
        _read(settings, "hf://org/name", tmp_path / "in", s3_credentials)
    with pytest.raises(InvalidRequestError, match="hf:// sources only"):
        _read(settings, "s3://bucket/lora", tmp_path / "in", HubCredentials(HUB_TOKEN))
    assert fake_hub.requests == []
    assert HUB_TOKEN not in repr(HubCredentials(HUB_TOKEN))


# ---- what is read ----------------------------------------------------------------------------------------


def test_public_repo_is_read_at_its_resolved_commit(tmp_path, fake_hub) -> None:
    commit = fake_hub.add_repo("org/lora", FILES)
    imported = _read(_settings(tmp_path, fake_hub), "hf://org/lora", tmp_path / "in")
    assert imported == ImportedFiles([CONFIG_FILENAME, WEIGHTS_FILENAME], source_revision=commit)
    _assert_adapter_read(tmp_path / "in")
    downloads = fake_hub.seen("resolve")
    assert sorted(r.path for r in downloads) == sorted(
        f"/org/lora/resolve/{commit}/{name}" for name in (CONFIG_FILENAME, WEIGHTS_FILENAME)
    )  # pinned to the commit, never "main"; README.md and .gitattributes never fetched
    assert [r.path for r in fake_hub.seen("revision")] == ["/api/models/org/lora"]  # one metadata call


def test_revision_pins_a_tag_or_commit_while_the_branch_moves_on(tmp_path, fake_hub) -> None:
    first = fake_hub.add_repo("org/lora", FILES)
    fake_hub.push("org/lora", FILES, ref="v1")
    newer = FILES | {WEIGHTS_FILENAME: WEIGHTS[::-1]}
    second = fake_hub.push("org/lora", newer)
    settings = _settings(tmp_path, fake_hub)
    assert _read(settings, "hf://org/lora@v1", tmp_path / "tag").source_revision == first
    _assert_adapter_read(tmp_path / "tag")
    assert _read(settings, f"hf://org/lora@{first}", tmp_path / "commit").source_revision == first
    _assert_adapter_read(tmp_path / "commit")
    assert _read(settings, "hf://org/lora", tmp_path / "main").source_revision == second
    _assert_adapter_read(tmp_path / "main", newer)
    assert all(
        f"/resolve/{first}/" in r.path or f"/resolve/{second}/" in r.path for r in fake_hub.seen("resolve")
    )


def test_private_repo_is_read_with_the_tenants_token_only(tmp_path, fake_hub, caplog) -> None:
    commit = fake_hub.add_repo("org/private", FILES, token=HUB_TOKEN)
    with caplog.at_level(logging.DEBUG):
        imported = _read(
            _settings(tmp_path, fake_hub), "hf://org/private", tmp_path / "in", HubCredentials(HUB_TOKEN)
        )
    assert imported.source_revision == commit
    _assert_adapter_read(tmp_path / "in")
    assert set(fake_hub.authorizations()) == {f"Bearer {HUB_TOKEN}"}
    assert len(fake_hub.authorizations()) == len(fake_hub.requests)
    assert HUB_TOKEN not in caplog.text


def test_tokenless_import_never_sends_the_platforms_hf_token(tmp_path, fake_hub, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", PLATFORM_TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", PLATFORM_TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the operator's setting wins, not the env's
    fake_hub.add_repo("org/lora", FILES)
    fake_hub.add_repo("org/private", FILES, token=PLATFORM_TOKEN)
    settings = _settings(tmp_path, fake_hub)
    _read(settings, "hf://org/lora", tmp_path / "in")
    with pytest.raises(SourceUnreadableError):  # readable with the platform's token: never used
        _read(settings, "hf://org/private", tmp_path / "private")
    assert fake_hub.requests and fake_hub.authorizations() == []


def test_every_unreadable_hub_source_gives_the_same_error(tmp_path, fake_hub, caplog) -> None:
    fake_hub.add_repo("org/private", FILES, token=HUB_TOKEN)
    fake_hub.add_repo("org/public", FILES)
    settings = _settings(tmp_path, fake_hub)
    cases = {
        "private without token": ("hf://org/private", None),
        "private with a wrong token": ("hf://org/private", HubCredentials("hf_wrong")),
        "missing repo": ("hf://org/missing", None),
        "missing repo with a token": ("hf://org/missing", HubCredentials(HUB_TOKEN)),
        "missing revision": ("hf://org/public@no-such-branch", None),
        "missing commit": ("hf://org/public@" + "0" * 40, None),
    }
    messages = set()
    with caplog.at_level(logging.DEBUG):
        for case, (source, credentials) in cases.items():
            with pytest.raises(SourceUnreadableError) as err:
                _read(settings, source, tmp_path / case.replace(" ", "-"), credentials)
            messages.add((err.value.code, err.value.message))
    assert messages == {("source_unreadable", UNREADABLE_MESSAGE)}
    assert fake_hub.seen("resolve") == []
    assert HUB_TOKEN not in caplog.text and "hf_wrong" not in caplog.text


def test_unreachable_hub_endpoint_gives_the_generic_error(tmp_path, fake_hub) -> None:
    from tests.registry.db_fixtures import free_port

    settings = Settings(data_dir=tmp_path, import_hf_endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SourceUnreadableError):
        _read(settings, "hf://org/lora", tmp_path / "in")


def test_a_hub_that_stops_answering_times_out_with_the_generic_error(tmp_path, fake_hub, monkeypatch) -> None:
    fake_hub.add_repo("org/lora", FILES)
    fake_hub.stall = threading.Event()  # set when the test ends: no answer before
    monkeypatch.setattr(hub_source, "METADATA_TIMEOUT_S", 0.2)
    with pytest.raises(SourceUnreadableError):
        _read(_settings(tmp_path, fake_hub), "hf://org/lora", tmp_path / "in")
    assert len(fake_hub.requests) == 1 and list((tmp_path / "in").iterdir()) == []


def test_an_adapter_file_without_a_declared_size_cannot_be_bounded() -> None:
    with pytest.raises(OSError, match="no size"):  # read_import_source makes it the generic error
        hub_source.adapter_files({CONFIG_FILENAME: 10, WEIGHTS_FILENAME: None})
    files = hub_source.adapter_files({CONFIG_FILENAME: 10, WEIGHTS_FILENAME: 20, "x/y": None})
    assert [f.num_bytes for f in files] == [10, 20]


# ---- what is refused before a byte is downloaded -----------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "code"),
    [
        ({CONFIG_FILENAME: CONFIG, "README.md": b"#"}, "missing_weights"),
        ({WEIGHTS_FILENAME: WEIGHTS}, "missing_config"),
        ({CONFIG_FILENAME: CONFIG, "adapter_model.bin": b"pickle"}, "pickle_not_allowed"),
    ],
)
def test_repo_without_the_adapters_files_is_refused_naming_what_is_missing(tmp_path, fake_hub, files, code):
    fake_hub.add_repo("org/odd", files)
    with pytest.raises(AdapterValidationError) as err:
        _read(_settings(tmp_path, fake_hub), "hf://org/odd", tmp_path / "in")
    assert err.value.code == code
    if code == "pickle_not_allowed":
        assert "adapter_model.bin" in err.value.message and "safetensors" in err.value.message
    assert fake_hub.seen("resolve") == [] and list((tmp_path / "in").iterdir()) == []


def test_repo_larger_than_the_upload_limit_is_refused_before_downloading(tmp_path, fake_hub) -> None:
    fake_hub.add_repo("org/big", FILES)
    with pytest.raises(AdapterValidationError) as err:
        _read(_settings(tmp_path, fake_hub), "hf://org/big", tmp_path / "in", max_bytes=len(WEIGHTS))
    assert err.value.code == "upload_too_large" and "LORAHOST_MAX_UPLOAD_BYTES" in err.value.message
    assert fake_hub.seen("resolve") == [] and list((tmp_path / "in").iterdir()) == []


def test_weights_beyond_the_plans_storage_left_are_refused_before_downloading(tmp_path, fake_hub) -> None:
    fake_hub.add_repo("org/big", FILES)
    with pytest.raises(StorageQuotaError, match="max_stored_bytes"):
        _read(
            _settings(tmp_path, fake_hub), "hf://org/big", tmp_path / "in", max_weights_bytes=len(WEIGHTS) - 1
        )
    assert fake_hub.seen("resolve") == [] and list((tmp_path / "in").iterdir()) == []
    _read(_settings(tmp_path, fake_hub), "hf://org/big", tmp_path / "fits", max_weights_bytes=len(WEIGHTS))
    _assert_adapter_read(tmp_path / "fits")


# ---- the download ------------------------------------------------------------------------------------------


def test_a_reset_mid_file_resumes_with_a_range_from_the_bytes_written(tmp_path, fake_hub) -> None:
    commit = fake_hub.add_repo("org/lora", FILES)
    fake_hub.reset_once = {WEIGHTS_FILENAME}
    assert _read(_settings(tmp_path, fake_hub), "hf://org/lora", tmp_path / "in").source_revision == commit
    _assert_adapter_read(tmp_path / "in")
    weights_gets = [r for r in fake_hub.seen("resolve") if r.path.endswith(WEIGHTS_FILENAME)]
    assert len(weights_gets) == 2 and "range" not in weights_gets[0].headers
    resumed_from = int(weights_gets[1].headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_from < len(WEIGHTS)  # not started over


def test_a_server_ignoring_the_range_is_read_again_from_the_start(tmp_path, fake_hub) -> None:
    fake_hub.add_repo("org/lora", FILES)
    fake_hub.reset_once = {WEIGHTS_FILENAME}
    fake_hub.is_range_ignored = True
    _read(_settings(tmp_path, fake_hub), "hf://org/lora", tmp_path / "in")
    _assert_adapter_read(tmp_path / "in")  # the 200's whole body replaced the half written, not appended
    weights_gets = [r for r in fake_hub.seen("resolve") if r.path.endswith(WEIGHTS_FILENAME)]
    assert len(weights_gets) == 2 and "range" in weights_gets[1].headers


def test_the_token_goes_to_the_hub_and_never_to_the_cdn_it_redirects_to(tmp_path, fake_hub) -> None:
    commit = fake_hub.add_repo("org/private", FILES, token=HUB_TOKEN)
    fake_hub.is_cdn_redirect = True
    fake_hub.reset_once = {WEIGHTS_FILENAME}  # the resume goes through the Hub's resolve again
    settings = _settings(tmp_path, fake_hub)
    assert (
        _read(settings, "hf://org/private", tmp_path / "in", HubCredentials(HUB_TOKEN)).source_revision
        == commit
    )
    _assert_adapter_read(tmp_path / "in")
    assert {r.headers.get("authorization") for r in fake_hub.seen("resolve")} == {f"Bearer {HUB_TOKEN}"}
    cdn = fake_hub.seen("cdn")
    assert len(cdn) == 3 and all("authorization" not in r.headers for r in cdn)
    assert all(f"/cdn/org/private/{commit}/" in r.path for r in cdn)
    assert "range" in cdn[-1].headers


def test_resets_on_every_attempt_end_with_the_generic_error(tmp_path, fake_hub, monkeypatch) -> None:
    fake_hub.add_repo("org/lora", FILES)
    monkeypatch.setattr(hub_download, "RETRY_BACKOFF_S", (0.0,))
    monkeypatch.setattr(hub_download, "_fetch_rest", _always_reset)
    with pytest.raises(SourceUnreadableError):
        _read(_settings(tmp_path, fake_hub), "hf://org/lora", tmp_path / "in")
    assert _always_reset.calls == hub_download.MAX_ATTEMPTS  # type: ignore[attr-defined]


def _always_reset(*args: object) -> None:
    _always_reset.calls = getattr(_always_reset, "calls", 0) + 1  # type: ignore[attr-defined]
    import httpx

    raise httpx.ReadError("connection reset")


@pytest.mark.parametrize("is_length_omitted", [False, True], ids=["content-length", "no-length"])
def test_a_server_that_lies_about_sizes_is_cut_off_at_the_declared_size(
    tmp_path, fake_hub, is_length_omitted
):
    fake_hub.add_repo("org/liar", FILES)
    fake_hub.repos["org/liar"].declared_sizes = {WEIGHTS_FILENAME: 1000}
    fake_hub.is_length_omitted = is_length_omitted
    written: list[int] = []
    with pytest.raises(SourceUnreadableError):
        _read(_settings(tmp_path, fake_hub), "hf://org/liar", tmp_path / "in", max_weights_bytes=1000)
    for path in (tmp_path / "in").iterdir():
        written.append(path.stat().st_size)
    assert max(written, default=0) <= 1000  # nothing written beyond what was declared and checked
