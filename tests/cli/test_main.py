"""The command line's shape: every command's parser builds, --help and --version stay cheap, and
the layers import as ARCHITECTURE.md says (function-level imports count)."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def test_version_prints_the_package_version():
    done = subprocess.run([PRIME_AGENT, "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"prime-agent {version('prime-agent')}\n", "")


def test_help_lists_every_command_and_imports_none_of_them():
    code = ("import sys\nfrom cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('cli.') and m != 'cli.main'), file=sys.stderr)\n"
            "print(sorted(m for m in ('openai', 'agent', 'daemon', 'rl', 'evals', 'torch') if m in sys.modules), "
            "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stderr == "[]\n[]\n"
    for name, command in COMMANDS.items():
        assert name in done.stdout and command.help.split()[0] in done.stdout


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "demo"])  # the demo parses its own options
def test_each_command_builds_its_parser_and_its_help(name, capsys):
    with pytest.raises(SystemExit) as exit:
        build_parser(name).parse_args([name, "--help"])
    assert exit.value.code == 0 and f"usage: prime-agent {name}" in capsys.readouterr().out


def test_a_flag_is_parsed_by_the_module_that_declares_it():
    args = build_parser("run").parse_args(["run", "hi", "--max-turns", "3", "-c", "a=1", "-c", "b=2"])
    assert (args.command, args.task, args.max_turns, args.config) == ("run", "hi", 3, ["a=1", "b=2"])
    args = build_parser("rate").parse_args(["rate", "last", "0.5", "--note", "ok"])
    assert (args.command, args.session, args.score, args.note) == ("rate", "last", 0.5, "ok")
    args = build_parser("rl").parse_args(["rl", "train", "c.toml", "--train.lr", "1e-3"])
    assert (args.action, args.config, args.overrides) == ("train", "c.toml", ["--train.lr", "1e-3"])


def imports(package: str) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of ours it imports anywhere in it."""
    ours = {"agent", "harness_store", "daemon", "evals", "rl", "tui", "cli"}
    graph = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and \
                    node.args and isinstance(node.args[0], ast.Constant):
                names.add(node.args[0].value)
        graph[module] = {n for n in names if n.split(".")[0] in ours}
    return graph


def test_nothing_imports_the_front_ends_and_the_app_imports_only_what_it_shows():
    for package in ("agent", "harness_store", "daemon", "evals", "rl"):
        for module, names in imports(package).items():
            assert not {n for n in names if n.split(".")[0] in ("cli", "tui")}, module
    for module, names in imports("tui").items():
        assert not {n for n in names if n.split(".")[0] in ("rl", "evals", "harness_store", "cli")}, module


def test_no_command_module_imports_one_that_imports_it_back():
    graph = imports("cli")
    modules = set(graph) | {c.module for c in COMMANDS.values()}  # main reaches each through import_module
    graph["cli.main"] |= {c.module for c in COMMANDS.values()}
    edges = {m: {n for n in graph.get(m, ()) if n in modules} for m in modules}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in edges[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        return seen

    assert [m for m in sorted(modules) if m in reach(m)] == []
