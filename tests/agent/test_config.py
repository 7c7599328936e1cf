"""Layered configuration: defaults < user file < project file < environment < command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_config, parse_override


def test_sources_apply_in_order(prime_home: Path, project: Path, monkeypatch: pytest.MonkeyPatch):
    prime_home.mkdir()
    (prime_home / "config.toml").write_text(
        '[model]\nname = "user-model"\ntemperature = 0.1\ntimeout = 11\n[kernel]\ncell_timeout = 7\n'
    )
    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text('[model]\nname = "project-model"\ntemperature = 0.2\n')
    sub = project / "src"
    sub.mkdir()
    assert load_config(sub).model.name == "project-model"  # the project root is found from below

    monkeypatch.setenv("PRIME_AGENT_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:9/v1")
    cfg = load_config(project, parse_override("model.temperature=0.3"))
    assert (cfg.model.name, cfg.model.temperature, cfg.model.timeout) == ("env-model", 0.3, 11)
    assert cfg.model.base_url == "http://localhost:9/v1"
    assert cfg.kernel.cell_timeout == 7
    assert cfg.budget.max_steps == 200  # a default nobody overrode


def test_an_invalid_file_names_the_file_and_field(prime_home: Path, project: Path):
    prime_home.mkdir()
    bad = prime_home / "config.toml"
    bad.write_text('[model]\ntimeout = "soon"\n')
    with pytest.raises(ConfigError, match=rf"{bad}: field model.timeout: .*number"):
        load_config(project)
    bad.write_text("[kernel]\ncel_timeout = 3\n")
    with pytest.raises(ConfigError, match=r"field kernel.cel_timeout: Extra inputs are not permitted"):
        load_config(project)
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(project)


def test_overrides_parse_toml_values_or_fall_back_to_strings():
    assert parse_override("budget.max_steps=5") == {"budget": {"max_steps": 5}}
    assert parse_override("model.name=gpt-4.1") == {"model": {"name": "gpt-4.1"}}
    assert parse_override('model.extra_body={top_k = 20}') == {"model": {"extra_body": {"top_k": 20}}}
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("model.name")
    with pytest.raises(ConfigError, match="command line: field budget.max_steps"):
        load_config(Path("."), parse_override("budget.max_steps=many"))
