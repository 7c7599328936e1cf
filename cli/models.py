"""`prime-agent models pull|list`: the models under $PRIME_AGENT_HOME/models (rl/pull.py)."""

from __future__ import annotations

import argparse
import sys

from rl.pull import KNOWN, ModelError, ModelNotFound, installed, models_dir, pull


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    pull_ = actions.add_parser("pull", help="install a known model as a Hugging Face directory (prints its path)")
    pull_.add_argument("name", help=f"one of: {', '.join(KNOWN)}")
    actions.add_parser("list", help="installed models (size, source, path), and the known ones not pulled")


def main(args: argparse.Namespace) -> int:
    """Exit codes: 0 done, 1 a pull that failed, 2 a name it does not know (a usage error, as argparse's)."""
    if args.action == "pull":
        try:
            path = pull(args.name, progress=lambda line: print(line, file=sys.stderr, flush=True))
        except ModelError as e:
            print(f"prime-agent models pull: {e}", file=sys.stderr)
            return 2 if isinstance(e, ModelNotFound) else 1
        print(path)
        return 0
    return _list()


def _list() -> int:
    found = installed()
    header = ("NAME", "SIZE", "SOURCE", "PATH")
    rows = [header, *((m.name, _size(m.size), m.source, str(m.path)) for m in found)]
    rows += [(name, "-", f"not pulled (prime-agent models pull {name})", "")
             for name in KNOWN if name not in {m.name for m in found}]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f"{r[0]:<{width[0]}}  {r[1]:>{width[1]}}  {r[2]:<{width[2]}}  {r[3]}".rstrip())
    if not found:
        print(f"(nothing in {models_dir()} yet)", file=sys.stderr)
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
