"""Archive uploads (zip, tar.gz) that must be refused or accepted: unsafe paths, links, devices, bombs,
member counts, layouts. Part of the case tables of tests/registry/malformed.py."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

from tests.registry.upload_builders import (
    WEIGHTS,
    Files,
    MalformedCase,
    valid_members,
    write_tar,
    write_zip,
    zip_bomb,
)


def _tar_link(kind: bytes, name: str) -> Callable[[Path], Files]:
    def build(tmp_dir: Path) -> Files:
        link = tarfile.TarInfo(name)
        link.type = kind
        link.linkname = "/etc/passwd"
        return write_tar(tmp_dir / "adapter.tar.gz", [*valid_members()[:1], link])

    return build


def _tar_device(tmp_dir: Path) -> Files:
    device = tarfile.TarInfo(WEIGHTS)
    device.type = tarfile.CHRTYPE
    device.devmajor, device.devminor = 1, 3
    return write_tar(tmp_dir / "adapter.tgz", [*valid_members()[:1], device])


def _zip(
    members: Callable[[], list[tuple[str, bytes]]], symlinks: tuple[str, ...] = ()
) -> Callable[[Path], Files]:
    return lambda tmp_dir: write_zip(tmp_dir / "adapter.zip", members(), symlinks)


def _tar(members: Callable[[], list]) -> Callable[[Path], Files]:
    return lambda tmp_dir: write_tar(tmp_dir / "adapter.tar.gz", members())


def _not_an_archive(tmp_dir: Path) -> Files:
    (tmp_dir / "adapter.zip").write_bytes(b"PK\x03\x04 this is not really a zip file" * 4)
    return [tmp_dir / "adapter.zip"]


ARCHIVE_CASES: list[MalformedCase] = [
    MalformedCase(
        "zip_parent_dir", _zip(lambda: [("../" + n, c) for n, c in valid_members()]), "unsafe_archive_path"
    ),
    MalformedCase("tar_absolute_path", _tar(lambda: valid_members("/tmp/adapter/")), "unsafe_archive_path"),
    MalformedCase("tar_symlink", _tar_link(tarfile.SYMTYPE, WEIGHTS), "archive_link_not_allowed"),
    MalformedCase("tar_hardlink", _tar_link(tarfile.LNKTYPE, WEIGHTS), "archive_link_not_allowed"),
    MalformedCase("zip_symlink", _zip(valid_members, symlinks=(WEIGHTS,)), "archive_link_not_allowed"),
    MalformedCase("tar_device", _tar_device, "unsupported_archive_member"),
    MalformedCase("zip_bomb", lambda d: zip_bomb(d / "adapter.zip", 1100), "archive_too_large"),
    MalformedCase(
        "zip_too_many_members",
        _zip(lambda: [*valid_members(), *[(f"README{i}.md", b"") for i in range(8)]]),
        "too_many_archive_members",
    ),
    MalformedCase(
        "zip_duplicate_names", _zip(lambda: [*valid_members(), valid_members()[0]]), "duplicate_file"
    ),
    MalformedCase(
        "zip_extra_file", _zip(lambda: [*valid_members(), ("notes.txt", b"hi")]), "unexpected_file"
    ),
    MalformedCase(
        "zip_pickle",
        _zip(lambda: [valid_members()[0], ("adapter_model.bin", b"\x80\x04")]),
        "pickle_not_allowed",
    ),
    MalformedCase("zip_nested_folders", _zip(lambda: valid_members("a/b/")), "invalid_archive_layout"),
    MalformedCase(
        "zip_two_folders",
        _zip(
            lambda: (
                [("a/" + n, c) for n, c in valid_members()[:1]]
                + [("b/" + n, c) for n, c in valid_members()[1:]]
            )
        ),
        "invalid_archive_layout",
    ),
    MalformedCase("zip_missing_weights", _zip(lambda: valid_members()[:1]), "missing_weights"),
    MalformedCase("not_an_archive", _not_an_archive, "corrupt_archive"),
    MalformedCase(
        "tgz_bad_weights_inside", _tar(lambda: [valid_members()[0], (WEIGHTS, b"")]), "empty_weights"
    ),
]

ARCHIVE_TIGHT_LIMIT_CASES: list[MalformedCase] = [
    MalformedCase(
        "tar_bomb", _tar(lambda: [valid_members()[0], (WEIGHTS, b"\0" * (1 << 20))]), "archive_too_large"
    ),
    MalformedCase("zip_bomb_small", lambda d: zip_bomb(d / "adapter.zip", 1), "archive_too_large"),
]

VALID_ARCHIVE_CASES: list[MalformedCase] = [
    MalformedCase("valid_zip_flat", _zip(valid_members), ""),
    MalformedCase(
        "valid_zip_in_folder", _zip(lambda: [("my-adapter/", b""), *valid_members("my-adapter/")]), ""
    ),
    MalformedCase(
        "valid_tgz_in_folder",
        _tar(lambda: [*valid_members("my-adapter/"), ("my-adapter/README.md", b"hi")]),
        "",
    ),
    MalformedCase(
        "valid_zip_with_macos_junk",
        _zip(
            lambda: [
                *valid_members("a/"),
                ("__MACOSX/a/._adapter_config.json", b"junk"),
                ("a/.DS_Store", b"junk"),
            ]
        ),
        "",
    ),
]
