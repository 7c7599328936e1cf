"""`--set KEY=VALUE`: a config override, one flag with one meaning for the app, `run`, `acp` and `eval`.

`run` and `acp` took `-c KEY=VALUE` before; it still works there, with a warning, for one release
(in the app `-c` is `--continue`, in `eval` it was the concurrency, now `-j`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agent.config import merge, parse_override


def add_set(p: argparse.ArgumentParser, what: str = "", deprecated_c: bool = False) -> None:
    """`--set KEY=VALUE` (repeatable) on `p`; `deprecated_c`: `-c/--config KEY=VALUE` too, deprecated."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help=f"override a config field{what}, e.g. --set model.temperature=0.2 (repeatable; values "
                        "are TOML, else text: --set model.action_format=text)")
    if deprecated_c:
        p.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE", dest="deprecated",
                       help="deprecated: --set KEY=VALUE (-c goes in the next release)")


def read_overrides(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The overrides `--set` (and a deprecated `-c`) gave, nested as in config.toml; a deprecated
    `-c` is said on stderr. agent.config.ConfigError for one that is not KEY=VALUE."""
    deprecated: list[str] = getattr(args, "deprecated", [])
    if deprecated:
        print(f"prime-agent {command}: -c KEY=VALUE is deprecated and goes in the next release; use "
              + " ".join(f"--set {text}" for text in deprecated), file=sys.stderr)
    out: dict[str, Any] = {}
    for text in [*deprecated, *args.overrides]:
        merge(out, parse_override(text))
    return out


def looks_like_override(text: str | None) -> bool:
    """`model.temperature=0`: a dotted config key and a value, not a message (`-c` before it meant --set)."""
    from agent.config_models import Config

    if not text or "=" not in text or "\n" in text:
        return False
    key = text.split("=", 1)[0].strip()
    section, dot, _ = key.partition(".")
    return bool(dot) and " " not in key and section in Config.model_fields

