"""`prime-agent harness list|show|log|diff|rollback|import|export|review`: the versioned harness from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from agent.config import ConfigError, home, load_config, project_root
from agent.harness import SessionHarness, scope_roots
from agent.layout import SessionLayout, session_layouts, sessions_dir
from daemon.client import Client, DaemonError, daemon_pid
from harness_store.entries import HarnessError, size_text
from harness_store.refiner import Plan
from harness_store.skills import SkillRow, export_skills, import_skills, skill_folders
from harness_store.store import Change


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
    p.add_argument("--dry-run", action="store_true", help="show what would be imported; write nothing")
    p = action("export", "write skills out as an Agent Skills folder (DIR/<name>/SKILL.md, e.g. .claude/skills)", None)
    p.add_argument("--kind", choices=["skill"], required=True, help="what to export (skills have a standard format)")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("ids", nargs="*", metavar="ID", help="only these skills (default: every skill in force)")
    p.add_argument("--force", action="store_true", help="replace a skill folder already in DIR that differs")
    p.add_argument("--dry-run", action="store_true", help="show what would be written; write nothing")
    p = action("review", "changes waiting for a person (the agent's to the user or project scope, the refiner's "
                         "in review mode): list them, show one, accept or reject it", None)
    p.add_argument("id", nargs="?", help="the proposal to show (or decide)")
    decision = p.add_mutually_exclusive_group()
    decision.add_argument("--accept", action="store_true", help="accept it: in force from the session's next turn")
    decision.add_argument("--reject", action="store_true", help="reject it")


def main(args: argparse.Namespace) -> int:
    session_dir = SessionLayout.of(args.session).dir if args.session else None
    if session_dir is not None and not session_dir.is_dir():
        return _fail(f"no session {args.session!r} under {sessions_dir()}")
    if args.scope == "session" and session_dir is None:
        return _fail("--scope session needs --session ID")
    project = project_root(Path(args.project or "."))
    try:  # the caps on a skill's files matter to an import alone: a broken config.toml blocks nothing else
        limits = load_config(project).harness.limits() if args.action == "import" else None
    except ConfigError as e:
        return _fail(str(e))
    harness = SessionHarness(scope_roots(home(), project, session_dir), args.session, limits)
    try:
        return ACTIONS[args.action](harness, args)
    except HarnessError as e:
        return _fail(str(e))


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
    """Each skill imported or refused on its own; fails only when nothing could be imported."""
    src = Path(args.path).expanduser()
    folders = skill_folders(src)
    if not folders:
        return _fail(f"{src}: no SKILL.md in it or in its subfolders")
    report = import_skills(harness.store(args.scope), folders, summary=f"import skills from {src}",
                           dry_run=args.dry_run, session=args.session)
    if args.json:
        _json({"rows": [_row_json(r) for r in report.rows], "dry_run": args.dry_run,
               "change": _change_json(report.change) if report.change else None})
    else:
        _table(report.rows, args.dry_run)
        if report.change:
            print(f"{report.change.refinement_id}: {len(report.change.entries)} skill(s) into the {args.scope} scope "
                  f"[{', '.join(report.change.entries)}]; undo with: prime-agent harness rollback "
                  f"{report.change.refinement_id}")
    return 0 if report.ok else _fail("no skill could be imported")


def _export(harness: SessionHarness, args: argparse.Namespace) -> int:
    if args.scope:
        store = harness.store(args.scope)
        found = [(e, store) for e in sorted(store.entries(), key=lambda e: e.id) if e.kind == "skill"]
    else:
        in_force = sorted(harness.view.entries("skill"), key=lambda v: v.entry.id)
        found = [(v.entry, harness.store(v.scope)) for v in in_force]
    missing = sorted(set(args.ids) - {e.id for e, _ in found})
    if missing:
        where = f"the {args.scope} scope" if args.scope else "any scope"
        return _fail(f"no skill {', '.join(map(repr, missing))} in {where}")
    chosen = [(e, store.skill_files(e.id)) for e, store in found if not args.ids or e.id in args.ids]
    if not chosen:
        return _fail("no skills to export")
    rows = export_skills(chosen, Path(args.dir).expanduser(), force=args.force, dry_run=args.dry_run)
    if args.json:
        _json({"rows": [_row_json(r) for r in rows], "dry_run": args.dry_run})
    else:
        _table(rows, args.dry_run)
    return 0 if any(r.status != "refused" for r in rows) else _fail("no skill could be exported")


def _review(harness: SessionHarness, args: argparse.Namespace) -> int:
    """Pending proposals from every session's `refinements/`; a decision goes through the refine
    command's own path (the daemon when it hosts the session), where the refiner's rules apply again."""
    waiting = [(layout.dir.name, Plan.from_json(path.read_text())) for layout in session_layouts()
               for path in sorted(layout.refinements.glob("*.json"))]
    if args.id is None:
        if args.accept or args.reject:
            return _fail("say which proposal: prime-agent harness review ID --accept")
        if args.json:
            return _json([{"id": plan.id, "session": sid, "source": plan.source, "summary": plan.proposal.summary,
                           "scopes": sorted({e.scope or "session" for e in plan.proposal.edits})} for sid, plan in waiting])
        for sid, plan in waiting:
            scopes = ",".join(sorted({e.scope or "session" for e in plan.proposal.edits}))
            print(f"{plan.id:<28}  {plan.source:<6}  {scopes:<12}  {plan.proposal.summary}  (session {sid})")
        if not waiting:
            print("(nothing waits for review)", file=sys.stderr)
        return 0
    found = [(sid, plan) for sid, plan in waiting if plan.id == args.id]
    if not found:
        return _fail(f"no proposal {args.id!r} waits for review (`prime-agent harness review` lists them)")
    sid, plan = found[0]
    if args.accept or args.reject:
        from cli.refine import decide

        return decide(sid, plan.id, approve=args.accept)
    if args.json:
        return _json({"id": plan.id, "session": sid, "source": plan.source, **plan.proposal.model_dump()})
    print(f"# {plan.id}: {plan.proposal.summary} (by the {plan.source}, session {sid})")
    for e in plan.proposal.edits:
        print(f"{e.action} {e.kind or ''} {e.id} ({e.scope or 'session'} scope)".replace("  ", " "))
        for name, value in (("title", e.title), ("description", e.description)):
            if value:
                print(f"  {name}: {value}")
        for line in (e.content or "").splitlines():
            print(f"+ {line}")
        for rel in sorted(e.files or {}):
            print(f"  file {rel} ({len((e.files or {})[rel]):,} characters)")
    print(f"accept with: prime-agent harness review {plan.id} --accept   (or --reject)")
    return 0


def _table(rows: list[SkillRow], dry_run: bool) -> None:
    width = max(len("skill"), *(len(r.id) for r in rows))
    print(f"{'skill':<{width}}  {'files':>5}  {'size':>9}  {'would be' if dry_run else 'result'}")
    for r in rows:
        status = f"refused: {r.reason}" if r.status == "refused" else r.status
        print(f"{r.id:<{width}}  {r.files or '-':>5}  {size_text(r.size) if r.size else '-':>9}  {status}")
        for w in r.warnings:
            print(f"{'':<{width}}  {'':>5}  {'':>9}  warning: {w}")
    if dry_run:
        print("(dry run: nothing written)")


def _row_json(r: SkillRow) -> dict:
    return {"skill": r.id, "files": r.files, "size": r.size, "status": r.status, "reason": r.reason,
            "warnings": r.warnings}


def _report(change: Change, args: argparse.Namespace) -> int:
    if args.json:
        return _json(_change_json(change))
    print(f"{change.refinement_id}: {change.summary}" + (f" [{', '.join(change.entries)}]" if change.entries else ""))
    return 0


def _change_json(c: Change) -> dict:  # a RolledBack is a Change too
    return {"commit": c.commit, "refinement_id": c.refinement_id, "trigger": c.trigger, "summary": c.summary,
            "date": c.date.isoformat(), "entries": c.entries, "trailers": c.trailers}


def _json(value: object) -> int:
    print(json.dumps(value, indent=2))
    return 0


def _fail(message: str) -> int:
    print(f"prime-agent: {message}", file=sys.stderr)
    return 2


ACTIONS = {"list": _list, "show": _show, "log": _log, "diff": _diff, "rollback": _rollback, "import": _import,
           "export": _export, "review": _review}
