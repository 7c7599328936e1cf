"""`prime-agent trust`: a person's say over the project files the host acts on (agent/trust.py).

    prime-agent trust               each file not trusted as it is now, shown whole (or as a diff against
                                    what was trusted), asked one by one; --yes trusts them all; then the
                                    project files the MCP servers and hooks now in force run (agent/hostrun.py)
    prime-agent trust --list        every trusted file, by project, and whether it is still as trusted
    prime-agent trust --revoke [PATH ...]   take the trust back (of every file of the project without PATH)

What is trusted is the content shown, read once; a file the host never reads (a link, not a regular
file, too large) cannot be trusted.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
import unicodedata
from pathlib import Path

from agent.config import Config, ConfigError, home, load_config, project_root
from agent.hostrun import PIN_MAX_BYTES
from agent.trust import ProjectFile, TrustError, TrustStore, candidates


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--project", type=Path, default=Path("."), help="the project (default: the current directory)")
    p.add_argument("--yes", "-y", action="store_true", help="trust every file shown without asking")
    p.add_argument("--list", action="store_true", help="every trusted file, by project")
    p.add_argument("--revoke", nargs="*", metavar="PATH",
                   help="take back the trust of each PATH (relative to the project's root), or of all its files")


def main(args: argparse.Namespace) -> int:
    store = TrustStore(home())
    root = project_root(args.project)
    try:
        if args.list:
            return _list(store)
        if args.revoke is not None:
            revoked = store.revoke(root, args.revoke)
            missing = [p for p in args.revoke if p not in revoked]
            for path in revoked:
                print(f"no longer trusted: {path} (in {root})")
            if missing or not revoked:
                print(f"prime-agent trust: nothing trusted to revoke in {root}" + (f": {', '.join(missing)}"
                      if missing else ""), file=sys.stderr)
                return 1
            return 0
        return review(store, args.project, args.yes)
    except TrustError as e:
        print(f"prime-agent trust: {e}", file=sys.stderr)
        return 1


def review(store: TrustStore, cwd: Path, yes: bool, only: list[str] | None = None,
           runs: tuple[str, ...] = ("mcp", "hook")) -> int:
    """Show each untrusted project file (of `only`, when given) and trust it if the person says so;
    then, the same way, the project files the MCP servers and hooks (`runs`) in force in `cwd` run."""
    root = project_root(cwd)
    try:
        instructions = load_config(cwd).project_instructions
    except ConfigError as e:  # a file trusted before that no longer loads: the default instruction files
        print(f"prime-agent trust: {e}", file=sys.stderr)
        instructions = Config().project_instructions
    files = [f for f in (store.check(root, p) for p in only or candidates(instructions)) if f is not None]
    waiting = [f for f in files if f.status != "trusted"]
    asking = not yes and sys.stdin.isatty()
    code = _decide(store, root, waiting, yes, asking)
    ran = _ran(store, cwd, runs)  # with what was just trusted in force
    code = max(code, _decide(store, root, ran, yes, asking))
    if not waiting and not ran:
        print(f"every file of {root} the host acts on is trusted as it is now" if files
              else f"{root} has no file the host acts on ({', '.join(candidates(instructions))})")
    return code


def _ran(store: TrustStore, cwd: Path, runs: tuple[str, ...]) -> list[ProjectFile]:
    """The project files the MCP servers and hooks of `runs` in force in `cwd` run, not trusted as they are."""
    try:
        pinned = load_config(cwd).pinned
    except ConfigError as e:
        print(f"prime-agent trust: {e}", file=sys.stderr)
        return []
    root = project_root(cwd)
    files = {path: store.check(root, path, what, PIN_MAX_BYTES) for path, what, kind in pinned if kind in runs}
    return [f for f in files.values() if f is not None and f.status != "trusted"]


def _decide(store: TrustStore, root: Path, waiting: list[ProjectFile], yes: bool, asking: bool) -> int:
    """Show each file and trust it when the person says so (or `yes`); 1 when one stays untrusted."""
    code = 0
    for f in waiting:
        _show(f, store.last_trusted(root, f.path))
        if f.status == "unsafe":
            code = 1
            continue
        if yes or (asking and input(f"Trust {f.path} as shown? [y/N] ").strip().lower() in ("y", "yes")):
            store.trust(root, f)
            print(f"trusted: {f.path}")
        elif not asking:
            print(f"not trusted: {f.path} (run `prime-agent trust --yes` to trust it as shown)")
            code = 1
        else:
            print(f"not trusted: {f.path}")
    return code


def _show(f: ProjectFile, before: bytes | None) -> None:
    """The file whole, or what changed since it was trusted; nothing a terminal would act on."""
    print(f"\n== {f.path}: {f.what}")
    if f.content is None:
        print(f"   {f.why}: the host never reads it, so it cannot be trusted")
        return
    if b"\0" in f.content:
        print(f"   {'new' if before is None else 'changed since you trusted it'}; binary, {len(f.content):,} bytes, "
              f"sha256 {f.digest}")
        return
    now = _printable(f.content)
    if before is None:
        print(f"   new; its content ({len(f.content):,} bytes):")
        print(now if now.endswith("\n") else now + "\n", end="")
        return
    print("   changed since you trusted it:")
    old = _printable(before)
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(keepends=True), now.splitlines(keepends=True),
                                               f"{f.path} (trusted)", f"{f.path} (now)"))
    print()


def _printable(content: bytes) -> str:
    """Text as a person must see it: invalid bytes, control and format characters (escapes that would
    move the cursor or hide a line, bidirectional overrides) written out as escapes."""
    text = content.decode("utf-8", errors="backslashreplace")
    return "".join(c if c in "\n\t" or not unicodedata.category(c).startswith("C") else c.encode("unicode_escape")
                   .decode() for c in text)


def _list(store: TrustStore) -> int:
    projects = store.projects()
    if not projects:
        print("no project file is trusted (prime-agent trust, in a project, reviews them)")
        return 0
    for root, files in sorted(projects.items()):
        print(root)
        for path, entry in sorted(files.items()):
            try:
                now = store.check(Path(root), path)
                state = "absent now" if now is None else "as trusted" if now.status == "trusted" else f"{now.status} now"
            except OSError as e:
                state = f"unreadable now: {e.strerror or e}"
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.get("trusted", 0)))
            print(f"  {path}  sha256 {str(entry.get('sha256'))[:12]}  trusted {when}  ({state})")
    return 0
