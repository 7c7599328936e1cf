"""Layered configuration: defaults < user file < project file < environment < command line."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from agent.config import ConfigError, load_config, parse_override
from agent.config_models import Config
from agent.types import Budget
from tests.conftest import trust


def test_sources_apply_in_order(prime_home: Path, project: Path, monkeypatch: pytest.MonkeyPatch):
    prime_home.mkdir()
    (prime_home / "config.toml").write_text(
        '[model]\nname = "user-model"\ntemperature = 0.1\ntimeout = 11\n[kernel]\ncell_timeout = 7\n'
    )
    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text('[model]\nname = "project-model"\ntemperature = 0.2\n')
    trust(project, ".prime-agent/config.toml")
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


def _sections(model: type[BaseModel]) -> set[type[BaseModel]]:
    """Every model a config is made of, `model` included."""
    out = {model}
    for field in model.model_fields.values():
        for t in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(t, type) and issubclass(t, BaseModel) and t not in out:
                out |= _sections(t)
    return out


def test_every_config_section_refuses_nan_and_infinity():
    sections = _sections(Config)
    assert len(sections) == 14 and Budget in sections
    # Budget is agent.types' (the loop's own type): the raw-value check refuses its NaN (below).
    assert [m for m in sections - {Budget} if m.model_config.get("allow_inf_nan") is not False] == []
    for bad in ({"kernel": {"cell_timeout": float("nan")}}, {"model": {"temperature": float("inf")}}):
        with pytest.raises(ValidationError, match="finite number"):
            Config.model_validate(bad)


@pytest.mark.parametrize("text, field", [
    ("[kernel]\ncell_timeout = nan\n", "kernel.cell_timeout"),
    ("[model]\ntemperature = -inf\n", "model.temperature"),
    ("[budget]\nmax_seconds = inf\n", "budget.max_seconds"),  # Budget is agent.types', reached all the same
    ("[model.extra_body]\nstop = [1.0, nan]\n", "model.extra_body.stop.1"),
])
def test_non_finite_numbers_are_refused_in_every_source(prime_home: Path, project: Path, text: str, field: str):
    prime_home.mkdir()
    config = prime_home / "config.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{config}: field {re.escape(field)}: Input should be a finite number"):
        load_config(project)
    config.unlink()
    section, _, key = field.partition(".")
    override = f"{section}.{key.split('.')[0]}={'nan' if 'nan' in text else 'inf'}"
    with pytest.raises(ConfigError, match=r"^command line: field .*finite number"):
        load_config(project, parse_override(override))


def test_values_nested_too_deep_are_refused_before_validation(prime_home: Path, project: Path):
    deep: dict = {"x": 1}
    for _ in range(5000):  # far past the interpreter's recursion limit
        deep = {"a": deep}
    with pytest.raises(ConfigError, match=r"^req: field model\.extra_body\.a\.a.*\.\.\.: nested deeper than 32 levels"):
        load_config(project, {"model": {"extra_body": deep}}, source="req")
    prime_home.mkdir()
    (prime_home / "config.toml").write_text("[model]\nextra_body = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n")
    with pytest.raises(ConfigError, match="config.toml: nested deeper than 32 levels"):
        load_config(project)
    with pytest.raises(ConfigError, match="nested deeper than 32 levels"):
        parse_override("model.extra_body=" + "[" * 2000 + "]" * 2000)
    (prime_home / "config.toml").write_text("[model]\nextra_body = " + "{a = " * 30 + "1" + "}" * 30 + "\n")
    assert load_config(project).model.extra_body["a"]["a"]  # 32 levels in all: allowed


def test_a_path_too_long_for_the_file_system_is_a_config_error(project: Path):
    deep = project
    while len(str(deep)) < 4080:
        deep /= "d" * min(200, 4080 - len(str(deep)))
    deep.mkdir(parents=True)
    (deep / ".git").mkdir()  # its own project root, whose .prime-agent/config.toml cannot even be looked for
    with pytest.raises(ConfigError, match=r"config.toml \(4,1\d\d characters\): File name too long"):
        load_config(deep)


def test_mcp_servers_come_from_mcp_json_and_config_toml(project: Path, prime_home: Path):
    import json as _json

    (project / ".mcp.json").write_text(_json.dumps({"mcpServers": {
        "gh": {"command": "npx", "args": ["-y", "srv"], "env": {"T": "${GH_TOKEN}"}, "someOtherToolsKey": 1},
        "docs": {"type": "http", "url": "https://x/mcp", "headers": {"Authorization": "Bearer ${D}"}}}}))
    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text('[mcp.servers.gh]\npolicy = "ask"\n')
    trust(project, ".mcp.json", ".prime-agent/config.toml")
    servers = load_config(project).mcp.servers
    assert (servers["gh"].type, servers["gh"].command, servers["gh"].env, servers["gh"].policy) == (
        "stdio", "npx", {"T": "${GH_TOKEN}"}, "ask")  # expanded only when the server starts
    assert (servers["docs"].type, servers["docs"].headers) == ("http", {"Authorization": "Bearer ${D}"})
    (project / ".mcp.json").write_text('{"mcpServers": {"bad": {"type": "http"}}}')
    trust(project, ".mcp.json")
    with pytest.raises(ConfigError, match=r"\.mcp\.json: field mcp\.servers\.bad: .*needs a `url`"):
        load_config(project)
    (project / ".mcp.json").write_text('{"mcpServers": [1]')
    trust(project, ".mcp.json")
    with pytest.raises(ConfigError, match=r"\.mcp\.json: not valid JSON"):
        load_config(project)


def test_project_files_count_only_as_a_person_trusted_them(prime_home: Path, project: Path):
    (project / ".prime-agent").mkdir()
    config = project / ".prime-agent" / "config.toml"
    config.write_text('[model]\nname = "from-the-project"\n')
    (project / ".mcp.json").symlink_to(prime_home / "config.toml")  # a link: never read, whatever it points to
    loaded = load_config(project)
    assert loaded.model.name is None and loaded.mcp.servers == {}
    assert loaded.ignored == [
        ".mcp.json (MCP servers the host starts) is ignored: a symbolic link, or reached through one; the host "
        "never reads it",
        ".prime-agent/config.toml (project settings) is new and ignored until you trust it: prime-agent trust"]
    trust(project, ".prime-agent/config.toml")
    assert load_config(project).model.name == "from-the-project"
    config.write_text('[model]\nname = "changed"\n')
    loaded = load_config(project)
    assert loaded.model.name is None and "changed since you trusted it" in loaded.ignored[-1]
    config.write_text('[model]\nname = "from-the-project"\n')  # the content trusted, again: in force again
    assert load_config(project).model.name == "from-the-project"


def test_a_project_file_only_tightens_the_sandbox_field_by_field(prime_home: Path, project: Path):
    prime_home.mkdir()
    (prime_home / "config.toml").write_text(
        '[sandbox]\nnetwork = false\nenv_allow = ["A", "B"]\nmax_processes = 200\napproval = "never"\nmemory_mb = 1000\n')
    (project / ".prime-agent").mkdir()
    (project / ".prime-agent" / "config.toml").write_text(
        '[sandbox]\nmode = "full-access"\nnetwork = true\nrequired = true\nhidden = ["~/.vault"]\n'
        'env_deny = ["*DB*"]\nenv_allow = ["B", "C"]\nmemory_mb = 500\nmax_processes = 300\nmax_open_files = 100\n'
        'approval = "on-request"\napproval_timeout = 10\n')
    trust(project, ".prime-agent/config.toml")
    loaded = load_config(project)
    s = loaded.sandbox
    assert (s.mode, s.network, s.required, s.approval, s.approval_timeout) == ("workspace-write", False, True, "never", 10)
    assert s.hidden[-1] == "~/.vault" and "~/.ssh/" in s.hidden  # added to, never taken from
    assert s.env_deny[-1] == "*DB*" and "*KEY*" in s.env_deny
    assert (s.env_allow, s.memory_mb, s.max_processes, s.max_open_files) == (["B"], 500, 200, 100)
    refused = [line.split(": ", 2)[1] for line in loaded.ignored]
    assert refused == ["sandbox.mode", "sandbox.network", "sandbox.hidden", "sandbox.env_deny", "sandbox.env_allow",
                       "sandbox.max_processes", "sandbox.approval"], loaded.ignored
    assert loaded.ignored[0] == (
        ".prime-agent/config.toml: sandbox.mode: 'full-access' ignored, yours ('workspace-write') stays; a project file "
        "may only tighten the sandbox (set it in $PRIME_AGENT_HOME/config.toml, with a flag (--sandbox, -c) or in the "
        "API's request)")
    # The person loosens it: a flag (or a request) is theirs.
    assert load_config(project, parse_override('sandbox.mode="full-access"')).sandbox.mode == "full-access"


def test_every_sandbox_field_has_a_tightening_rule():
    """A field added to SandboxConfig is refused from project files until `tighten` says what tightens it."""
    from agent.config import tighten
    from agent.config_models import SandboxConfig

    person = SandboxConfig()
    for field in SandboxConfig.model_fields:
        kept, refused = tighten(person, {field: getattr(person, field)}, "p")
        assert refused == [] and field in kept, field
