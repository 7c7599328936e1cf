"""One meaning per flag (issue 52): `-c` is `--continue` in the app only; a config override is `--set
KEY=VALUE` for the app, `run`, `acp` and `eval` (`-c KEY=VALUE` still works in `run` and `acp`, with a
warning, for one release); `eval`'s concurrency is `-j`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import build_parser
from cli.overrides import read_overrides

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def prime_agent(*argv: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PRIME_AGENT, *argv], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def test_continue_with_what_reads_as_a_config_override_is_refused_not_sent_to_the_model(tmp_path: Path):
    """`prime-agent -c model.temperature=0` sent "model.temperature=0" to the model as a prompt."""
    done = prime_agent("-c", "model.temperature=0", cwd=tmp_path, PRIME_AGENT_MODEL="fake",
                       OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    assert done.returncode == 2, done.stderr
    assert "-c is --continue" in done.stderr and "--set model.temperature=0" in done.stderr
    assert "prime-agent -c -- model.temperature=0" in done.stderr  # the way to send it anyway
    assert not (Path(os.environ["PRIME_AGENT_HOME"]) / "run").exists()  # no daemon was started, no app opened


@pytest.mark.parametrize("command", ["run", "acp", "eval"])
def test_set_overrides_a_config_field_in_every_command_that_has_a_config(command: str):
    args = build_parser(command).parse_args([command, *(["task"] if command != "acp" else []),
                                             "--set", "model.temperature=0", "--set", "model.action_format=text"])
    assert read_overrides(args, command) == {"model": {"temperature": 0, "action_format": "text"}}


@pytest.mark.parametrize("command", ["run", "acp"])
def test_dash_c_still_overrides_in_run_and_acp_and_says_it_is_deprecated(command: str, capsys):
    args = build_parser(command).parse_args([command, *(["task"] if command == "run" else []),
                                             "-c", "model.temperature=0", "--set", "model.temperature=1"])
    assert read_overrides(args, command) == {"model": {"temperature": 1}}  # --set wins
    said = capsys.readouterr().err
    assert f"prime-agent {command}: -c KEY=VALUE is deprecated" in said and "--set model.temperature=0" in said


def test_run_with_dash_c_warns_and_still_reads_it(tmp_path: Path):
    done = prime_agent("run", "-c", "model.temperature=0", "hi", cwd=tmp_path)
    assert done.returncode == 2 and "no model configured" in done.stderr  # read, then the missing model said
    assert "-c KEY=VALUE is deprecated and goes in the next release; use --set model.temperature=0" in done.stderr
    assert done.stderr.strip().endswith("For a model without tool calling, add: --set model.action_format=text")


def test_eval_concurrency_is_dash_j_and_dash_c_is_its_deprecated_alias(tmp_path: Path):
    args = build_parser("eval").parse_args(["eval", "repo_fix", "-j", "3"])
    assert args.concurrency == 3
    done = prime_agent("eval", "repo_fix", "-j", "0", cwd=tmp_path)
    assert done.returncode == 2 and "--concurrency must be at least 1" in done.stderr
    done = prime_agent("eval", "repo_fix", "-c", "0", cwd=tmp_path)
    assert done.returncode == 2 and "-c N is deprecated and goes in the next release; use -j 0" in done.stderr
    assert "--concurrency must be at least 1" in done.stderr  # read as the concurrency it was
