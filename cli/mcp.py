"""`prime-agent mcp list|add|remove`: the MCP servers a session in this project gets.

`add` and `remove` edit `[mcp.servers.NAME]` in the user's or the project's config.toml (comments
and layout kept); `remove` also takes a server out of the project's .mcp.json. `list` starts each
server to show its state and tools (and caches the listing the system prompt names). A project file
edited here stays trusted when it was (agent/trust.py); servers of files nobody trusted are not listed."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from harness_store import safefs
from agent.config import MCP_JSON, ConfigError, home, load_config, project_root
from agent.config_models import McpServerConfig
from agent.trust import TrustError, TrustStore


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--project", type=Path, default=Path("."), help="the project (default: the current directory)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="each server: transport, policy, state, tools (starts them)")
    ls.add_argument("--no-start", action="store_true", help="start nothing: tools as last listed")
    add = actions.add_parser("add", help="add a server: NAME -- COMMAND [ARGS...], or NAME --url URL",
                             usage="prime-agent mcp add NAME [options] (--url URL | -- COMMAND [ARGS...])")
    add.add_argument("name")
    add.add_argument("--url", help="an HTTP server's endpoint (streamable HTTP; --transport sse for the older kind)")
    add.add_argument("--transport", choices=["stdio", "http", "sse"], help="default: stdio with a command, http with --url")
    add.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="for a stdio server; ${VAR} expands")
    add.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'", help="for an HTTP server")
    add.add_argument("--policy", choices=["allow", "ask", "deny"])
    add.add_argument("--timeout", type=float, help="seconds a call may take")
    add.add_argument("--scope", choices=["project", "user"], default="project",
                     help="the project's .prime-agent/config.toml (default) or $PRIME_AGENT_HOME/config.toml")
    add.set_defaults(argv=[])  # the command after `--` (cli.main takes it off before parsing)
    rm = actions.add_parser("remove", help="remove a server from the scope's config.toml (and the project's .mcp.json)")
    rm.add_argument("name")
    rm.add_argument("--scope", choices=["project", "user"], default="project")


def main(args: argparse.Namespace) -> int:
    try:
        return {"list": _list, "add": _add, "remove": _remove}[args.action](args)
    except (ConfigError, TrustError) as e:
        print(f"prime-agent mcp {args.action}: {e}", file=sys.stderr)
        return 1


def _config_file(args: argparse.Namespace) -> Path:
    return home() / "config.toml" if args.scope == "user" else project_root(args.project) / ".prime-agent" / "config.toml"


def _list(args: argparse.Namespace) -> int:
    from agent.mcp import McpServers

    config = load_config(args.project)
    for line in config.ignored:
        print(f"project: {line}", file=sys.stderr)
    if not config.mcp.servers:
        print("no MCP servers configured (prime-agent mcp add NAME -- COMMAND ARGS..., or the project's .mcp.json)")
        return 0

    async def listed():
        with tempfile.TemporaryDirectory() as logs:  # what the servers print while listed
            servers = McpServers(config.mcp, project_root(args.project), Path(logs))
            try:
                return servers.infos() if args.no_start else await servers.list()
            finally:
                await servers.close()

    for s in asyncio.run(listed()):
        print("\n".join(s.lines()))
    return 0


def _add(args: argparse.Namespace) -> int:
    import tomlkit

    command = args.argv
    if bool(command) == bool(args.url):
        raise ConfigError("give a command after -- (a stdio server) or --url (an HTTP server), not both")
    entry: dict = {"command": command[0], "args": command[1:]} if command else {"url": args.url}
    if args.transport:
        entry["type"] = args.transport
    if args.env:
        entry["env"] = dict(_pair(e, "=", "--env") for e in args.env)
    if args.header:
        entry["headers"] = dict(_pair(h, ":", "--header") for h in args.header)
    for key in ("policy", "timeout"):
        if getattr(args, key) is not None:
            entry[key] = getattr(args, key)
    try:
        McpServerConfig.model_validate(entry)
    except ValueError as e:
        raise ConfigError(f"server {args.name!r}: {e}") from None
    path = _config_file(args)
    doc = _read(path, args.project)
    servers = doc.setdefault("mcp", tomlkit.table(is_super_table=True)).setdefault("servers", tomlkit.table(True))
    replaced = args.name in servers
    servers[args.name] = entry
    _write(path, tomlkit.dumps(doc), args.project)
    print(f"{'replaced' if replaced else 'added'} MCP server {args.name!r} in {path}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    import tomlkit

    path = _config_file(args)
    doc = _read(path, args.project)
    servers = doc.get("mcp", {}).get("servers", {})
    removed = []
    if args.name in servers:
        del servers[args.name]
        _write(path, tomlkit.dumps(doc), args.project)
        removed.append(str(path))
    mcp_json = project_root(args.project) / MCP_JSON
    text = _current(mcp_json, args.project) if args.scope == "project" else None
    if text is not None:
        data = json.loads(text)
        if args.name in data.get("mcpServers", {}):
            del data["mcpServers"][args.name]
            _write(mcp_json, json.dumps(data, indent=2) + "\n", args.project)
            removed.append(str(mcp_json))
    if not removed:
        known = ", ".join(load_config(args.project).mcp.servers) or "none"
        raise ConfigError(f"no MCP server {args.name!r} in the {args.scope} scope; configured: {known}")
    print(f"removed MCP server {args.name!r} from {' and '.join(removed)}")
    return 0


def _pair(text: str, sep: str, option: str) -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key.strip():
        raise ConfigError(f"{option} {text!r}: expected KEY{sep}VALUE")
    return key.strip(), value.strip() if sep == ":" else value


def _read(path: Path, project: Path):
    import tomlkit

    try:
        text = _current(path, project)
        return tomlkit.parse(text) if text is not None else tomlkit.document()
    except (OSError, tomlkit.exceptions.ParseError) as e:
        raise ConfigError(f"{path}: {e}") from None


def _project_path(path: Path, project: Path) -> tuple[Path, str] | None:
    """(the project's root, the path under it) for a project file; None for the user's config."""
    root = project_root(project)
    return (root, str(path.relative_to(root))) if root in path.parents else None


def _current(path: Path, project: Path) -> str | None:
    """The file's text, None when absent; a project file is read without following a link."""
    at = _project_path(path, project)
    if at is None:
        return path.read_text() if path.is_file() else None
    file = TrustStore(home()).check(*at)
    if file is not None and file.content is None:
        raise ConfigError(f"{path}: {file.why}; it is not edited")
    return None if file is None else file.content.decode(errors="replace")


def _put(path: Path, project: Path, text: str | None) -> None:
    at = _project_path(path, project)
    if at is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text) if text is not None else path.unlink()
    elif text is not None:
        safefs.write_bytes(at[0], Path(at[1]), text.encode())
    else:
        safefs.unlink(at[0], Path(at[1]))


def _write(path: Path, text: str, project: Path) -> None:
    """Write the file, and keep it only if the whole configuration still loads. A project file is
    the person's edit: trusted as written where what it replaced was trusted (or it is new), so it
    takes effect; content nobody trusted stays so, this edit with it, until `prime-agent trust`."""
    store, at, old = TrustStore(home()), _project_path(path, project), _current(path, project)
    trusted = at is None or old is None or store.trusted(*at) is not None
    _put(path, project, text)
    if at is not None and trusted:
        store.trust(at[0], store.check(*at))
    try:
        load_config(project)
    except ConfigError:
        _put(path, project, old)
        if at is not None and trusted:
            store.trust(at[0], store.check(*at)) if old is not None else store.revoke(at[0], [at[1]])
        raise
    if not trusted:
        print(f"{path} holds content nobody trusted, so it is ignored until you review it: prime-agent trust",
              file=sys.stderr)
