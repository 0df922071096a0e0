"""`resolve_profile`: a twin profile from a file path or the name of a shipped one (twin/profiles/),
for the operator (CLI, settings); `resolve_profile_name`: by name only, for requests (POST /v1/admin/plan)."""

from __future__ import annotations

from pathlib import Path

from twin.profile import ProfileError, TwinProfile, load_profile

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "profiles"


def shipped_profile_names() -> list[str]:
    """Names of the shipped profiles (file stems)."""
    return sorted(p.name.removesuffix(".json") for p in SHIPPED_DIR.glob("*.json"))


def resolve_profile(name_or_path: str) -> TwinProfile:
    """Load `name_or_path` as a file when one exists there, else the shipped profile of that name; ProfileError
    listing the shipped names otherwise."""
    path = Path(name_or_path)
    if path.is_file():
        return load_profile(path)
    name = name_or_path.removesuffix(".json")
    shipped = SHIPPED_DIR / f"{name}.json"
    if "/" not in name and shipped.is_file():
        return load_profile(shipped)
    raise ProfileError(
        f"{name_or_path}: no such profile file, nor a shipped profile of that name "
        f"(shipped: {', '.join(shipped_profile_names())})"
    )


def configured_profile_name(configured: str) -> str:
    """The name the operator's configured profile (a shipped name or a file path) goes by: its file name
    without the suffix."""
    name = Path(configured).name
    for suffix in (".json", ".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return name


def resolve_profile_name(name: str | None, configured: str) -> TwinProfile:
    """The profile a request names: None for the operator's `configured` one, else a shipped profile's name or
    the configured profile's name (configured_profile_name). A request never names a file: anything else is a
    ProfileError listing the valid names, and no file is looked at (nothing of the server's files leaks)."""
    if name is None:
        return resolve_profile(configured)
    key = name.removesuffix(".json")
    if key == configured_profile_name(configured):
        return resolve_profile(configured)
    if key in shipped_profile_names():
        return load_profile(SHIPPED_DIR / f"{key}.json")
    valid = sorted({configured_profile_name(configured), *shipped_profile_names()})
    raise ProfileError(
        f"no profile named {name!r}: name a profile, not a file (shipped: {', '.join(shipped_profile_names())}; "
        f"valid here: {', '.join(valid)})"
    )
