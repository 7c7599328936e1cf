"""Configuration: where a session's comes from, loaded from layered sources and merged (the models,
one per component, are agent/config_models.py).

Order, later wins: defaults < $PRIME_AGENT_HOME/config.toml < <project>/.mcp.json (its MCP servers,
Claude Code's format) < <project>/.prime-agent/config.toml < environment (OPENAI_BASE_URL,
OPENAI_API_KEY (ANTHROPIC_API_KEY where the provider is `anthropic`), PRIME_AGENT_MODEL) <
command-line overrides (or a request's).

The project's two files count only once a person trusted their exact content (agent/trust.py), and
even then a project may only tighten the sandbox (`tighten`): what loosens it comes from the person
(the user's config.toml, a flag, the API). What was left out is in `Config.ignored`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.config_models import Config, SandboxConfig, detect_provider
from agent.hooks import HooksError, hook_what
from agent.hooks import read as read_hooks
from agent.hostrun import Host, expand, server_words
from agent.trust import TrustError, TrustStore

MAX_DEPTH = 32
"""How deeply a config value may nest (tables and arrays, counted from the top): bounded, so
nothing that walks a config (validation, a deep copy, a JSON encoder) can run out of stack."""


class ConfigError(Exception):
    """A configuration source is invalid; the message names the source and the field."""


ENV_VARS = {
    "OPENAI_BASE_URL": ("model", "base_url"),
    "OPENAI_API_KEY": ("model", "api_key"),
    "ANTHROPIC_API_KEY": ("model", "api_key"),
    "PRIME_AGENT_MODEL": ("model", "name"),
}
"""The environment's settings; of the two keys, the one of the provider in force counts (`key_var`)."""


def key_var(model: Any) -> str:
    """The environment variable holding the API key for a `[model]` table's provider."""
    model = model if isinstance(model, dict) else {}
    base_url = model.get("base_url") if isinstance(model.get("base_url"), str) else None
    provider = model.get("provider") or detect_provider(base_url)
    return "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"


def home() -> Path:
    """The one root for all persistent state, always absolute. A relative `PRIME_AGENT_HOME` (`home`,
    `~/x` quoted) is resolved once, against the directory it is first read in, and written back to
    the environment: every later read, in this process after a change of directory and in the kernels,
    git commands and daemon it starts, names the same directory."""
    value = os.environ.get("PRIME_AGENT_HOME")
    if not value:
        return Path.home() / ".prime-agent"
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = Path(os.path.abspath(path))
    if str(path) != value:
        os.environ["PRIME_AGENT_HOME"] = str(path)
    return path


def project_root(cwd: Path) -> Path:
    """The nearest ancestor of `cwd` holding `.prime-agent/` or `.git`, else `cwd` itself. An empty
    directory marks nothing (git too ignores an empty `.git`): the sandbox puts such placeholders
    where these are absent while a kernel runs, so that it cannot create them."""
    cwd = cwd.resolve()
    for d in (cwd, *cwd.parents):
        if marks(d / ".prime-agent", dir_only=True) or marks(d / ".git"):
            return d
    return cwd


def marks(path: Path, dir_only: bool = False) -> bool:
    """Whether `.git` or `.prime-agent` at `path` is one: not absent, not an empty folder (the
    sandbox's placeholder)."""
    try:
        if path.is_dir():
            return next(path.iterdir(), None) is not None
    except OSError:
        return True  # there, but not ours to list
    return not dir_only and path.exists()


def load_config(cwd: Path, overrides: dict[str, Any] | None = None, source: str = "command line") -> Config:
    """Merge every source for a session in `cwd`; raise ConfigError naming the bad source and field.

    `source` names the overrides in messages (the command line's, or a request's)."""
    merged: dict[str, Any] = {}
    root = project_root(cwd)
    user = home() / "config.toml"
    store = TrustStore(home())
    ignored: list[str] = []
    try:
        if user.is_file():
            _add(merged, _read_toml(user), str(user))
        person = SandboxConfig.model_validate(merged.get("sandbox", {}))
        for name in (MCP_JSON, PROJECT_CONFIG):  # each checked over what came before it (a policy for a server .mcp.json names)
            if name == PROJECT_CONFIG and (root / ".prime-agent").resolve() == home().resolve():
                continue  # the project is the home's parent: its .prime-agent/config.toml is the user's
            file = store.check(root, name)
            if file is None:
                continue
            if file.status != "trusted":
                ignored.append(file.line())
                continue
            path = root / name
            data = read_mcp_json(path, file.content) if name == MCP_JSON else _read_toml(path, file.content)
            if isinstance(data.get("sandbox"), dict):
                _parse({"sandbox": data["sandbox"]}, str(path))
                data["sandbox"], refused = tighten(person, data["sandbox"], name)
                ignored += refused
            _add(merged, data, str(path))
        env: dict[str, Any] = {}
        for var, (section, key) in ENV_VARS.items():
            if os.environ.get(var) and key != "api_key":
                env.setdefault(section, {})[key] = os.environ[var]
        merge(merged, env)
        given = _validated(overrides, source) if overrides else {}
        if os.environ.get(var := key_var({**_table(merged, "model"), **_table(given, "model")})):
            merge(merged, {"model": {"api_key": os.environ[var]}})
        merge(merged, given)
        config = _parse(merged, "configuration")
        for name in config.project_instructions:
            file = store.check(root, name)
            if file is not None and file.status != "trusted":
                ignored.append(file.line())
        user_hooks = home() / "hooks.json"
        if user_hooks.is_file():
            config._hooks.append(("user", read_hooks(user_hooks, user_hooks.read_text(errors="replace"))))
        file = store.check(root, PROJECT_HOOKS)
        if file is not None and file.status != "trusted":
            ignored.append(file.line())
        elif file is not None and file.content is not None:
            config._hooks.append(("project", read_hooks(root / PROJECT_HOOKS, file.content.decode(errors="replace"))))
        ignored += hold_back(config, Host(home(), root, cwd.resolve()))
    except HooksError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"{shorten(e.filename or cwd)}: {e.strerror}") from None
    except TrustError as e:
        raise ConfigError(str(e)) from None
    config._ignored = ignored
    return config


def hold_back(config: Config, host: Host) -> list[str]:
    """Leave out each MCP server and hook whose command runs a project file nobody trusted as it is
    now (agent/hostrun.py), a line each; every file they run goes to `config.pinned`, whoever
    configured them (a command of yours that runs the project's script runs what a cell can write)."""
    lines = []
    for name, server in list(config.mcp.servers.items()):
        if server.type == "stdio" and server.command:
            what = f"run by MCP server {name!r}"
            try:
                at = host.within(expand(server.cwd, os.environ) if server.cwd else None)
            except KeyError:  # its start will say which variable is unset
                continue
            paths = at.pinned([server_words(server.command, server.args, os.environ)])
            config._pinned += [(p, what, "mcp") for p in paths]
            if held := host.untrusted(paths, what):
                del config.mcp.servers[name]
                lines += [f.line(f"MCP server {name!r} does not start") for f in held]
    for source, f in config.hooks:
        for event, groups in f.hooks.items():
            for group in groups:
                kept = []
                for spec in group.hooks:
                    what = hook_what(event, source)
                    paths = host.pinned(host.shell_words(spec.command)) if spec.type == "command" and spec.command else []
                    config._pinned += [(p, what, "hook") for p in paths]
                    held = host.untrusted(paths, what)
                    lines += [f.line("the hook does not run") for f in held]
                    kept += [] if held else [spec]
                group.hooks = kept
    return lines


def _add(merged: dict[str, Any], data: dict[str, Any], source: str) -> None:
    """Merge one file's `data` into `merged`, when what results is a valid configuration."""
    check_values(data, source)
    candidate = copy.deepcopy(merged)
    merge(candidate, data)
    _parse(candidate, source)
    merged.clear()
    merged.update(candidate)


SANDBOX_ORDER = {"read-only": 0, "workspace-write": 1, "full-access": 2}
"""Sandbox modes from the tightest."""
LOOSENS = "a project file may only tighten the sandbox"
FROM_THE_PERSON = "set it in $PRIME_AGENT_HOME/config.toml, with a flag (--sandbox, -c) or in the API's request"


def tighten(person: SandboxConfig, project: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """What of a project file's `[sandbox]` applies over the person's sandbox (defaults and the user's
    config.toml): only what confines the kernel more. Each field's rule:

        mode                  only as strict or stricter: read-only < workspace-write < full-access
        network               only false;  required, seccomp, plan: only true;  approval: only "never"
        hidden, env_deny      added to the person's: a project hides more, never less
        env_allow             only names the person's env_allow has: a project lets fewer in
        memory_mb, max_processes, max_open_files, approval_timeout: only lower

    A field without a rule here (one added later) is refused until it has one. `project` is valid
    (checked by the caller, naming its file); returns the table to apply and a line for each
    setting ignored."""
    wanted = SandboxConfig.model_validate({**person.model_dump(), **project})
    kept: dict[str, Any] = {}
    refused: list[str] = []

    def refuse(field: str, why: str) -> None:
        refused.append(f"{source}: sandbox.{field}: {why}; {LOOSENS} ({FROM_THE_PERSON})")

    ram_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**21  # the default limit: half the RAM
    for field in project:
        mine, theirs = getattr(person, field), getattr(wanted, field)
        if field == "mode":
            ok = SANDBOX_ORDER[theirs] <= SANDBOX_ORDER[mine]
        elif field == "network":
            ok = theirs is False or theirs == mine
        elif field in ("required", "seccomp", "plan"):
            ok = theirs is True or theirs == mine
        elif field == "approval":
            ok = theirs == "never" or theirs == mine
        elif field in ("hidden", "env_deny"):
            kept[field] = mine + [p for p in theirs if p not in mine]
            if dropped := [p for p in mine if p not in theirs]:
                refuse(field, f"{', '.join(map(repr, dropped))} left out, and still covered")
            continue
        elif field == "env_allow":
            kept[field] = [p for p in theirs if p in mine]
            if added := [p for p in theirs if p not in mine]:
                refuse(field, f"{', '.join(map(repr, added))} ignored: it would let them into the kernel")
            continue
        elif field == "memory_mb":
            ok = theirs == mine or (theirs is not None and theirs <= (mine if mine is not None else ram_mb))
        elif field in ("max_processes", "max_open_files", "approval_timeout"):
            ok = theirs <= mine
        else:
            refuse(field, "ignored: it has no rule for what tightens it")
            continue
        if ok:
            kept[field] = theirs
        else:
            yours = f"{mine!r}" if mine is not None else f"None: half the RAM, {ram_mb:,} MB"
            refuse(field, f"{theirs!r} ignored, yours ({yours}) stays")
    return kept, refused


def parse_override(text: str) -> dict[str, Any]:
    """`model.temperature=0.2` -> {"model": {"temperature": 0.2}}; values are TOML, else strings."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. model.temperature=0.2")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise ConfigError(f"override {key.strip()!r}: nested deeper than {MAX_DEPTH} levels") from None
    out: dict[str, Any] = {}
    node = out
    *parents, leaf = key.strip().split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return out


MCP_JSON = ".mcp.json"
PROJECT_CONFIG = ".prime-agent/config.toml"
PROJECT_HOOKS = ".prime-agent/hooks.json"
MCP_JSON_KEYS = ("type", "command", "args", "env", "cwd", "url", "headers")
"""What a server of .mcp.json may say; other tools' own keys in the file are left to them."""


def read_mcp_json(path: Path, content: bytes | None = None) -> dict[str, Any]:
    """A project's .mcp.json (`{"mcpServers": {name: {...}}}`) as config: `{"mcp": {"servers": ...}}`;
    `content` is the file's as already read (and trusted)."""
    try:
        data = json.loads(path.read_bytes() if content is None else content)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read: {getattr(e, 'strerror', None) or e}") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    servers = data.get("mcpServers", {}) if isinstance(data, dict) else None
    if not isinstance(servers, dict) or not all(isinstance(s, dict) for s in servers.values()):
        raise ConfigError(f'{path}: expected {{"mcpServers": {{"NAME": {{"command": ...}} | {{"url": ...}}}}}}')
    known = {name: {k: v for k, v in server.items() if k in MCP_JSON_KEYS} for name, server in servers.items()}
    return {"mcp": {"servers": known}} if known else {}


def _read_toml(path: Path, content: bytes | None = None) -> dict[str, Any]:
    try:
        return tomllib.loads((path.read_bytes() if content is None else content).decode())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read: {getattr(e, 'strerror', None) or e}") from None


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    table = data.get(name)
    return table if isinstance(table, dict) else {}


def _validated(data: dict[str, Any], source: str) -> dict[str, Any]:
    _parse(data, source)
    return data


def _parse(data: dict[str, Any], source: str) -> Config:
    check_values(data, source)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe(e)}") from None


def check_values(data: Any, source: str) -> None:
    """Refuse, naming the field, what no config may hold wherever it comes from (a file, an
    override, a request): a value nested deeper than MAX_DEPTH, and a number that is not finite.

    Checked on the raw data, before anything recurses into it (this walk does not recurse), and
    on every value: free-form ones such as `model.extra_body` too, which no section's
    `allow_inf_nan=False` reaches. TOML and Python's json both read `nan` and `inf`; JSON cannot
    write them (pydantic writes null), so a session keeping one could not be loaded again."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: field {_dotted(path)}: Input should be a finite number, not {value}")
        if isinstance(value, dict | list) and value:
            if len(path) >= MAX_DEPTH:
                raise ConfigError(f"{source}: field {_dotted(path)}...: nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(((*path, k), v) for k, v in items)


def _dotted(path: tuple[Any, ...]) -> str:
    return shorten(".".join(str(p) for p in path), 200)


def shorten(text: Any, limit: int = 80) -> str:
    """A name or path as a message shows it: cut in the middle past `limit` characters (a
    request's 5,000-character path is not echoed whole)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-(limit // 2):]} ({len(text):,} characters)"


def describe(e: ValidationError) -> str:
    """A pydantic error as one line naming each bad field."""
    return "; ".join(f"field {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())


def merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Deep-merge `new` into `into` (nested tables merge, other values replace)."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v
