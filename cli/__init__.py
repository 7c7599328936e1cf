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
