"""What every dev-cluster child process gets in its environment (lorahost/dev_cluster_commands.py child_env)."""

from __future__ import annotations

import pytest

from lorahost.dev_cluster_commands import MALLOC_ARENA_MAX, child_env


def test_children_get_bounded_malloc_arenas_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert child_env({}, {}, is_moto=False)["MALLOC_ARENA_MAX"] == MALLOC_ARENA_MAX == "2"
    assert child_env({"MALLOC_ARENA_MAX": "4"}, {}, is_moto=False)["MALLOC_ARENA_MAX"] == "4"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    assert child_env({}, {}, is_moto=False)["MALLOC_ARENA_MAX"] == "1"


def test_what_the_cluster_owns_wins_over_the_config_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LORAHOST_ADMIN_KEY", "from-parent")
    env = child_env({"LORAHOST_ADMIN_KEY": "from-config"}, {"LORAHOST_ADMIN_KEY": "owned"}, is_moto=False)
    assert env["LORAHOST_ADMIN_KEY"] == "owned"
