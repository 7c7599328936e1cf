"""The command line's shape: every command's parser builds, --help and --version stay cheap (the
layers it may import are checked with the rest of the product's in tests/test_layers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from cli.main import COMMANDS, build_parser

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
    args = build_parser("run").parse_args(["run", "hi", "--max-turns", "3", "--set", "a=1", "--set", "b=2"])
    assert (args.command, args.task, args.max_turns, args.overrides) == ("run", "hi", 3, ["a=1", "b=2"])
    args = build_parser("rate").parse_args(["rate", "last", "0.5", "--note", "ok"])
    assert (args.command, args.session, args.score, args.note) == ("rate", "last", 0.5, "ok")
    args = build_parser("rl").parse_args(["rl", "train", "c.toml", "--train.lr", "1e-3"])
    assert (args.action, args.config, args.overrides) == ("train", "c.toml", ["--train.lr", "1e-3"])


def test_remote_unsandboxed_needs_tcp(prime_home: Path):
    r = subprocess.run([sys.executable, "-m", "cli", "daemon", "start", "--allow-remote-unsandboxed"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--allow-remote-unsandboxed goes with --tcp" in r.stderr


@pytest.mark.parametrize(("argv", "said"), [
    (["--bogus"], "prime-agent: error: unknown option --bogus: a command comes first"),
    (["run", "--bogus", "task"], "prime-agent run: error: unrecognized arguments: --bogus"),
    (["daemon", "start", "--nope"], "prime-agent daemon start: error: unrecognized arguments: --nope"),
    (["sesions"], "unknown command 'sesions'; did you mean 'sessions'? (to open the app with it as the first "
                  "message: prime-agent -- sesions)"),
    (["--model", "m", "--bogus"], "prime-agent: error: unrecognized arguments: --bogus"),
    (["--set", "nonsense"], "prime-agent: override 'nonsense': expected KEY=VALUE"),
])
def test_an_argument_error_names_the_problem_and_the_command(argv, said):
    done = subprocess.run([PRIME_AGENT, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr and "required" not in done.stderr


def test_every_option_of_the_app_opens_the_app():
    """`prime-agent --sandbox read-only` and `prime-agent --set k=v` reach the app, as --model does."""
    from cli.app import build_parser as app_parser
    from cli.main import APP_FLAGS

    options = {o for a in app_parser()._actions for o in a.option_strings} - {"-h", "--help"}
    assert options <= set(APP_FLAGS)
    args = app_parser().parse_args(["fix the bug", "--set", "model.action_format=text", "--set", "budget.max_steps=3"])
    assert (args.prompt, args.overrides) == ("fix the bug", ["model.action_format=text", "budget.max_steps=3"])


def test_without_a_model_the_app_gives_a_hint_that_works_in_the_app(prime_home: Path, tmp_path: Path):
    from agent.config import load_config, parse_override

    done = subprocess.run([PRIME_AGENT, "a prompt of several words"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2 and "no model configured" in done.stderr
    hint = done.stderr.strip().splitlines()[-1]
    assert hint == "For a model without tool calling, add: --set model.action_format=text"
    override = hint.rsplit("--set ", 1)[1]  # what it says to type is what --set reads
    assert load_config(tmp_path, parse_override(override)).model.action_format == "text"


def test_resume_of_an_unknown_id_names_it_and_opens_no_app(prime_home: Path, tmp_path: Path):
    env = {**os.environ, "PRIME_AGENT_MODEL": "fake", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    try:
        done = subprocess.run([PRIME_AGENT, "--resume", "20990101-000000-abcdef"], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
        assert done.returncode == 1, done.stderr
        assert "--resume 20990101-000000-abcdef: no such session" in done.stderr
    finally:
        subprocess.run([PRIME_AGENT, "daemon", "stop"], capture_output=True, timeout=60, env=env)
