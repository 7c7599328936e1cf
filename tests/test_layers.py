"""The product's imports point down the layers of docs/architecture.md §1, and no module imports one that
imports it back. Every import counts: module-level, function-level, under TYPE_CHECKING, and the
command modules cli.main reaches through importlib."""

from __future__ import annotations

import ast
from pathlib import Path

from cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness_store", "agent", "daemon", "evals", "rl", "tui", "cli", "prime_agent_py")
MAY_IMPORT = {
    "harness_store": set(),
    "agent": {"harness_store"},
    "daemon": {"agent", "harness_store"},
    "evals": {"agent", "harness_store"},
    "rl": {"evals", "agent", "harness_store"},
    "tui": {"daemon", "agent"},
    "cli": set(PACKAGES) - {"cli"},
    "prime_agent_py": set(),  # verifiers' harness: it starts `prime-agent acp`, and imports nothing of ours
}
"""Which packages each package's modules may import (besides its own)."""


def graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Each module of `packages` -> the modules of theirs it imports, anywhere in it."""
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for package in packages for p in sorted((root / package).rglob("*.py"))}
    edges: dict[str, set[str]] = {}
    for module, path in paths.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{path}: a relative import (the product uses absolute ones)"
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}  # `from agent import events`
        edges[module] = {n for n in names if n in paths} - {module}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """The modules that reach themselves."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in edges[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        return seen

    return [m for m in sorted(edges) if m in reach(m)]


def product() -> dict[str, set[str]]:
    edges = graph()
    edges["cli.main"] |= {c.module for c in COMMANDS.values()}  # importlib.import_module(COMMANDS[...].module)
    return edges


def test_imports_point_down_the_layers():
    wrong = sorted(f"{m} imports {n}" for m, names in product().items() for n in names
                   if n.split(".")[0] != m.split(".")[0] and n.split(".")[0] not in MAY_IMPORT[m.split(".")[0]])
    assert wrong == []


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(product()) == []


def test_a_cycle_hidden_in_function_level_and_type_checking_imports_is_found(tmp_path: Path):
    for package, source in {
        "a": "def f():\n    from b.y import g\n    return g\n",
        "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import x\n",
    }.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / ("x.py" if package == "a" else "y.py")).write_text(source)
    edges = graph(tmp_path, ("a", "b"))
    assert edges["a.x"] == {"b.y"} and "a.x" in edges["b.y"]
    assert cycles(edges) == ["a.x", "b.y"]


def test_the_kernel_package_imports_nothing_of_the_session():
    """agent/kernel/ is the OS-facing leaf: besides itself, only config (its loading and its models),
    layout and types."""
    allowed = {"agent.config", "agent.config_models", "agent.layout", "agent.types"}
    wrong = sorted(f"{m} imports {n}" for m, names in graph().items() if m.startswith("agent.kernel")
                   for n in names if not n.startswith("agent.kernel") and n not in allowed)
    assert wrong == []


def test_the_kernel_runtime_imports_only_the_standard_library():
    """The code inside the kernel (agent/kernel/runtime/) imports nothing of ours beyond itself, and
    importing it loads neither pydantic nor jupyter_client (the package's names load when asked)."""
    wrong = sorted(f"{m} imports {n}" for m, names in graph().items() if m.startswith("agent.kernel.runtime")
                   for n in names if not n.startswith("agent.kernel.runtime") and n != "agent.kernel")
    assert wrong == []
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, agent.kernel.runtime; "
                          "print(sorted(m for m in ('pydantic', 'jupyter_client', 'zmq') if m in sys.modules))"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
