"""`prime-agent harness list|show|log|diff|rollback|import`: the versioned harness from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from agent.config import home, project_root
from agent.harness import SessionHarness, scope_roots
from agent.layout import SessionLayout, sessions_dir
from daemon.client import Client, DaemonError, daemon_pid
from daemon.schemas import RolledBack
from harness_store.entries import HarnessError, parse
from harness_store.store import Change, Edit, HarnessStore, copy_skill_folder


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str, default_scope: str | None) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help)
        p.add_argument("--scope", choices=["user", "project", "session"], default=default_scope,
                       help=f"which scope (default: {default_scope or 'the merged view'})")
        p.add_argument("--session", metavar="ID", help="the session whose session scope to use")
        p.add_argument("--project", metavar="DIR", help="the project (default: the current directory's)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = action("list", "entries in force, narrowest scope first", None)
    p.add_argument("--kind", choices=["prompt", "memory", "skill", "subagent"])
    p = action("show", "one entry in full", None)
    p.add_argument("id")
    p = action("log", "changes, newest first", "user")
    p.add_argument("-n", type=int, default=20, metavar="N", help="how many (default 20)")
    p = action("diff", "what changed: the last change, or from A to B (refinement ids or commits)", "user")
    p.add_argument("a", nargs="?")
    p.add_argument("b", nargs="?")
    p = action("rollback", "undo one change (a new commit), or restore a whole earlier state with --to", "user")
    p.add_argument("ref", help="refinement id or commit")
    p.add_argument("--to", action="store_true", help="restore the whole scope as it was at REF")
    p = action("import", "import Agent Skills folders (.claude/skills, .agents/skills, or one skill)", "user")
    p.add_argument("path")


def main(args: argparse.Namespace) -> int:
    session_dir = SessionLayout.of(args.session).dir if args.session else None
    if session_dir is not None and not session_dir.is_dir():
        return _fail(f"no session {args.session!r} under {sessions_dir()}")
    if args.scope == "session" and session_dir is None:
        return _fail("--scope session needs --session ID")
    project = project_root(Path(args.project or "."))
    harness = SessionHarness(scope_roots(home(), project, session_dir), args.session)
    try:
        return ACTIONS[args.action](harness, args)
    except HarnessError as e:
        return _fail(str(e))
    finally:
        harness.close()


def _list(harness: SessionHarness, args: argparse.Namespace) -> int:
    if args.scope:
        view = [{"id": e.id, "kind": e.kind, "scope": args.scope, "title": e.title, "summary": e.summary}
                for e in sorted(harness.store(args.scope).entries(), key=lambda e: (e.kind, e.id))
                if args.kind in (None, e.kind)]
    else:
        view = harness.list(args.kind)
    if args.json:
        return _json(view)
    for row in view:
        print(f"{row['kind']:<8}  {row['id']:<28}  {row['scope']:<7}  {row['title']}")
    if not view:
        print("(no entries)", file=sys.stderr)
    return 0


def _show(harness: SessionHarness, args: argparse.Namespace) -> int:
    if args.scope:
        entry = harness.store(args.scope).get(args.id)
        scope, shadows = args.scope, []
    else:
        v = harness.view.get(args.id)
        entry, scope, shadows = v.entry, v.scope, v.shadows
    if args.json:
        return _json({"scope": scope, "shadows": shadows, **entry.model_dump(mode="json")})
    print(f"# {entry.kind} {entry.id} ({scope} scope" + (f"; hides {', '.join(shadows)}" if shadows else "") + ")")
    print(entry.render(), end="")
    return 0


def _log(harness: SessionHarness, args: argparse.Namespace) -> int:
    store = harness.store(args.scope)
    if not (store.root / ".git").is_dir():
        return _fail(f"the {args.scope} scope has no history yet ({store.root})")
    changes = store.log(args.n)
    if args.json:
        return _json([_change_json(c) for c in changes])
    for c in changes:
        print(f"{c.date:%Y-%m-%d %H:%M}  {c.refinement_id or c.commit[:12]:<28}  {c.trigger:<10}  {c.summary}"
              + (f"  [{', '.join(c.entries)}]" if c.entries else ""))
    return 0


def _diff(harness: SessionHarness, args: argparse.Namespace) -> int:
    sys.stdout.write(harness.store(args.scope).diff(args.a, args.b) + "\n")
    return 0


def _rollback(harness: SessionHarness, args: argparse.Namespace) -> int:
    """Through the daemon when it runs, so every live session on the scope drops the plans the
    rollback made stale (and a session's own rollback is its event); here otherwise."""
    if daemon_pid() is not None:
        return asyncio.run(_rollback_in_daemon(args))
    store = harness.store(args.scope)
    change = store.rollback_to(args.ref, session=args.session) if args.to else store.rollback(args.ref, session=args.session)
    return _report(change, args)


async def _rollback_in_daemon(args: argparse.Namespace) -> int:
    project = str(project_root(Path(args.project or ".")))
    async with Client() as client:
        try:
            r = await client.rollback(args.ref, args.scope, args.to, session=args.session, project=project)
        except DaemonError as e:
            return _fail(e.message)
    return _report(r, args)


def _import(harness: SessionHarness, args: argparse.Namespace) -> int:
    src = Path(args.path).expanduser()
    folders = [src] if (src / "SKILL.md").is_file() else sorted(p.parent for p in src.glob("*/SKILL.md"))
    if not folders:
        return _fail(f"{src}: no SKILL.md in it or in its subfolders")
    store: HarnessStore = harness.store(args.scope)
    edits = []
    for folder in folders:
        text, files = copy_skill_folder(folder)
        entry = parse(text, f"skill/{folder.name}/SKILL.md")
        exists = store.version_of(entry.id) is not None
        edits.append(Edit("update" if exists else "create", entry.id, kind="skill", title=entry.title,
                          description=entry.description, body=entry.body, metadata=entry.metadata, files=files))
    change = store.apply(edits, summary=f"import {len(edits)} skill(s) from {src}", trigger="import", source="user",
                         session=args.session)
    return _report(change, args)


def _report(change: Change | RolledBack, args: argparse.Namespace) -> int:
    if args.json:
        return _json(_change_json(change))
    print(f"{change.refinement_id}: {change.summary}" + (f" [{', '.join(change.entries)}]" if change.entries else ""))
    return 0


def _change_json(c: Change | RolledBack) -> dict:
    return {"commit": c.commit, "refinement_id": c.refinement_id, "trigger": c.trigger, "summary": c.summary,
            "date": c.date.isoformat(), "entries": c.entries, "trailers": c.trailers}


def _json(value: object) -> int:
    print(json.dumps(value, indent=2))
    return 0


def _fail(message: str) -> int:
    print(f"prime-agent: {message}", file=sys.stderr)
    return 2


ACTIONS = {"list": _list, "show": _show, "log": _log, "diff": _diff, "rollback": _rollback, "import": _import}
