"""`resolve_profile`: a twin profile from a file path or the name of a shipped one (scheduler/twin/profiles/)."""

from __future__ import annotations

from pathlib import Path

from scheduler.twin.profile import ProfileError, TwinProfile, load_profile

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
