"""`prime-agent trajectory export SESSION`: a session's conversations as OpenAI-chat JSONL (for SFT)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.layout import SessionLayout, session_layouts, sessions_dir
from agent.trajectory import TrajectoryError, export_openai_chat, read_records


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="export a session's conversations for fine-tuning")
    export.add_argument("session", help="session id, session directory, trajectory file, or 'last'")
    export.add_argument("--format", choices=["openai-chat"], default="openai-chat")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")


def find_trajectory(ref: str) -> Path:
    """A session id, session directory, trajectory file, or 'last' (the newest session)."""
    if ref == "last":
        candidates = sorted((s.trajectory for s in session_layouts()), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise FileNotFoundError(f"no sessions under {sessions_dir()}")
        return candidates[-1]
    for path in (Path(ref), SessionLayout(Path(ref)).trajectory, SessionLayout.of(ref).trajectory):
        if path.is_file():
            return path
    raise FileNotFoundError(f"no session {ref!r} (looked for a file, a directory and {SessionLayout.of(ref).dir})")


def main(args: argparse.Namespace) -> int:
    try:
        records = read_records(find_trajectory(args.session))
    except (FileNotFoundError, TrajectoryError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    lines = [json.dumps(example, ensure_ascii=False) + "\n" for example in export_openai_chat(records)]
    if args.output:
        Path(args.output).write_text("".join(lines))
        print(f"wrote {len(lines)} conversation(s) to {args.output}", file=sys.stderr)
    else:
        sys.stdout.writelines(lines)
    return 0
