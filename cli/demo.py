"""`prime-agent demo`: runs examples/closed_loop/run.py, which ships with the source tree."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "examples" / "closed_loop" / "run.py"


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("args", nargs=argparse.REMAINDER)  # cli.main hands them over as they are


def main(args: argparse.Namespace) -> int:
    if not DEMO.is_file():
        print(f"prime-agent: the demo ships with the source tree ({DEMO} is missing): run it from a clone, "
              "installed with `bash scripts/setup.sh`", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("closed_loop_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args.args)
