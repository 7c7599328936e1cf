"""`prime-agent trajectory export SESSION`: a session's conversations as OpenAI-chat JSONL (for SFT),
the whole session as one ATIF v1.8 document (`--format atif`, agent/atif.py), or as a Jupyter
notebook (`--format ipynb`, agent/notebook.py)."""

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
    export.add_argument("--format", choices=["openai-chat", "atif", "ipynb"], default="openai-chat",
                        help="openai-chat: JSONL, a conversation a line; atif: one ATIF v1.8 JSON document "
                             "(steps, cells as tool calls, token ids and logprobs, subagents embedded); ipynb: a "
                             "Jupyter notebook (prompts and answers as markdown, cells with their outputs and "
                             "figures, subagents as sections)")
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
        path = find_trajectory(args.session)
        if args.format == "atif":
            from agent.atif import to_atif
            from cli import version

            doc = to_atif(path, version())
            lines = [json.dumps(doc.to_json_dict(), ensure_ascii=False) + "\n"]
            what = f"{len(doc.steps)} steps and {len(doc.subagent_trajectories or [])} subagent(s)"
        elif args.format == "ipynb":
            import nbformat

            from agent.notebook import to_notebook

            nb = to_notebook(path)
            lines = [nbformat.writes(nb) + "\n"]
            what = f"a notebook of {sum(c.cell_type == 'code' for c in nb.cells)} code cell(s)"
        else:
            examples = export_openai_chat(read_records(path))
            lines = [json.dumps(example, ensure_ascii=False) + "\n" for example in examples]
            what = f"{len(lines)} conversation(s)"
    except (FileNotFoundError, TrajectoryError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text("".join(lines))
        print(f"wrote {what} to {args.output}", file=sys.stderr)
    else:
        sys.stdout.writelines(lines)
    return 0
