"""The `prime-agent` command line: cli.main finds the command, a module per command area runs it."""

from __future__ import annotations


def version() -> str:
    """This distribution's version: from its installed metadata, else from the source tree's pyproject.toml."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("prime-agent")
    except PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        return tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def invocation() -> str:
    """How a hint names this command: `prime-agent` when that is on PATH (and is this one), else the path
    it was started by (`.venv/bin/prime-agent` right after `bash scripts/setup.sh`, which puts nothing on
    PATH)."""
    import shutil
    import sys
    from pathlib import Path

    script = Path(sys.argv[0])
    if script.name != "prime-agent":  # `python -m cli`, a test: nothing better to say
        return "prime-agent"
    found = shutil.which("prime-agent")
    if found and Path(found).resolve() == script.resolve():
        return "prime-agent"
    try:
        return str(script.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(script.resolve())
