"""Every test gets its own $PRIME_AGENT_HOME and no model settings from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ENV_VARS, Config


@pytest.fixture(autouse=True)
def prime_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("PRIME_AGENT_HOME", str(home))
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project directory (a git root) for a session to work in."""
    root = tmp_path / "project"
    root.mkdir()
    (root / ".git").mkdir()
    return root


def make_config(**sections: dict) -> Config:
    """A Config with quick kernel timeouts for tests; `sections` override by component."""
    data: dict = {"kernel": {"interrupt_grace": 1.0}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)
