"""Write docs/configuration.md from the config models: every field, its type, its default and the
docstring under it (agent/config_models.py for sessions, rl/config.py for RL runs).

    python scripts/config_docs.py           # rewrite the page
    python scripts/config_docs.py --check   # exit 1 if the committed page differs (tests/test_docs.py)
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import textwrap
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

INTRO = """\
# Configuration

<!-- Written by scripts/config_docs.py from the config models' field docstrings: edit those, then run
`python scripts/config_docs.py`. tests/test_docs.py fails while this page differs from what it writes. -->

## Sessions: `config.toml`

A session reads, later wins: the defaults below < `$PRIME_AGENT_HOME/config.toml` < the project's
`.mcp.json` (its MCP servers, Claude Code's format) < `<project>/.prime-agent/config.toml` < the
environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `PRIME_AGENT_MODEL`) < `--set section.field=value`
and flags (values are TOML, else strings: `--set model.temperature=0.2`, `--set model.action_format=text`).
A daemon session may carry its own, nested as in `config.toml`: `"config": {"model": {...}}`.
Unknown fields, and numbers that are not finite, are refused with the source and field named.

```toml
[model]
name = "qwen2.5-coder"
base_url = "http://localhost:11434/v1"
fallback = ["qwen2.5-coder:7b"]
```
"""

RL_INTRO = """\
## RL runs: `prime-agent rl train CONFIG.toml`

An RL run's TOML file (`examples/reverse_text/config.toml`), with dotted overrides after it
(`--loss.name icepop --train.lr 3e-4`). See [rl.md](rl.md).
"""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring: the string literal under its annotated assignment in the class body (or in the
    body of the config class it inherits the field from)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if issubclass(k, BaseModel) and k is not BaseModel]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        docs |= {a.target.id: " ".join(inspect.cleandoc(b.value.value).split())
                 for a, b in zip(body, body[1:])
                 if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                 and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}
    return docs


def models_in(annotation: object) -> list[type[BaseModel]]:
    """The config models a field holds: itself, optional, or the values of a table of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def type_name(annotation: object) -> str:
    """A field's type as its reader wants it: `int | None`, `dict[str, Price]`, no module paths."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", text.replace("NoneType", "None"))


def field_line(name: str, f: FieldInfo, docs: dict[str, str]) -> str:
    """`- name (type, default): its docstring`."""
    default = f.get_default(call_default_factory=True)
    value = "unset" if default is None else f"`{json.dumps(default, default=str)}`"
    return f"- `{name}` ({type_name(f.annotation)}, {value}){': ' + docs[name] if name in docs else ''}"


def section(cls: type[BaseModel], key: str, prefix: str, variant: str = "") -> list[str]:
    """A `[key]` heading (with `variant`: which of the table's kinds), the model's own docstring, a line per
    field, then its nested tables."""
    doc = cls.__dict__.get("__doc__")
    lines = [f"### {prefix}`[{key}]`{variant}", ""] + ([" ".join(inspect.cleandoc(doc).split()), ""] if doc else [])
    docs, nested = field_docs(cls), []
    for name, f in cls.model_fields.items():
        lines.append(field_line(name, f, docs))
        table = typing.get_origin(f.annotation) is dict
        nested += [(m, f"{key}.{name}" + (".NAME" if table else "")) for m in models_in(f.annotation)]
    for model, sub in nested:
        lines += [""] + section(model, sub, prefix)
    return lines


def sections(root: type[BaseModel], prefix: str) -> list[str]:
    """Every top-level table of `root`, and its plain fields first under "top level"."""
    plain = {n: f for n, f in root.model_fields.items() if not models_in(f.annotation)}
    docs, lines = field_docs(root), []
    if plain:
        lines += [f"### {prefix}Top level", ""]
        lines += [field_line(n, f, docs) for n, f in plain.items()] + [""]
    for name, f in root.model_fields.items():
        if name in plain:
            continue
        kinds = models_in(f.annotation)
        if len(kinds) == 1:
            lines += section(kinds[0], name, prefix) + [""]
        else:  # a table of one of several kinds, told apart by its `name`
            for kind in kinds:
                lines += section(kind, name, prefix, f' `name = "{kind.model_fields["name"].default}"`') + [""]
    return lines


def render() -> str:
    """The whole page: a session's settings, then an RL run's."""
    from agent.config_models import Config
    from rl.config import RunConfig

    return "\n".join([INTRO, *sections(Config, ""), RL_INTRO, *sections(RunConfig, "RL: ")]).rstrip() + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(PAGE.parent.parent))
    text = render()
    if "--check" in sys.argv[1:]:
        sys.exit(0 if PAGE.read_text() == text else f"{PAGE} is stale: run python scripts/config_docs.py")
    PAGE.write_text(text)
