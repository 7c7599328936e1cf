"""The hooks engine with real hook commands (sh, python): what they get on stdin, and what their
exit codes and JSON decide."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest

from agent.hooks import Hooks, HooksError, HooksFile, read

def hooks(project: Path, config: dict, source: str = "user") -> Hooks:
    return Hooks.of([(source, HooksFile.model_validate(config))], project)


def command(event: str, line: str, matcher: str | None = None, timeout: float | None = None) -> dict:
    spec = {"type": "command", "command": line, **({"timeout": timeout} if timeout else {})}
    return {"hooks": {event: [{**({"matcher": matcher} if matcher is not None else {}), "hooks": [spec]}]}}


async def test_a_hook_gets_claude_codes_input_on_stdin_and_the_project_dir(project: Path, tmp_path: Path):
    seen = tmp_path / "seen.json"
    h = hooks(project, command("PreToolUse", f'cat > {seen}; echo "$CLAUDE_PROJECT_DIR" > {seen}.dir'))
    verdict = await h.run("PreToolUse", {"session_id": "s1", "transcript_path": "/t.jsonl", "tool_name": "ipython",
                                         "tool_input": {"code": "print(1)"}, "tool_use_id": "c1"}, target="ipython")
    assert not verdict.blocked and verdict.runs[0].exit_code == 0
    assert json.loads(seen.read_text()) == {
        "session_id": "s1", "transcript_path": "/t.jsonl", "tool_name": "ipython", "tool_input": {"code": "print(1)"},
        "tool_use_id": "c1", "hook_event_name": "PreToolUse", "cwd": str(project)}
    assert Path(f"{seen}.dir").read_text().strip() == str(project)


async def test_exit_2_blocks_with_stderr_and_other_codes_only_report(project: Path):
    h = Hooks.of([("user", HooksFile.model_validate(command("PreToolUse", "echo no rm -rf here >&2; exit 2"))),
                  ("user", HooksFile.model_validate(command("PreToolUse", "echo oops >&2; exit 1")))], project)
    verdict = await h.run("PreToolUse", {"tool_name": "ipython"}, target="ipython")
    assert verdict.blocked and verdict.reason == "no rm -rf here"
    failed = next(r for r in verdict.runs if r.exit_code == 1)
    assert failed.error == "exited 1: oops" and not failed.blocks


async def test_json_output_decides_permission_input_context_and_stopping(project: Path):
    out = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask",
                                  "permissionDecisionReason": "a person should see this",
                                  "updatedInput": {"code": "print('rewritten')"},
                                  "additionalContext": "the tests live in tests/"},
           "continue": True}
    h = hooks(project, command("PreToolUse", f"echo {shlex.quote(json.dumps(out))}"))
    verdict = await h.run("PreToolUse", {"tool_name": "ipython"}, target="ipython")
    assert verdict.permission == "ask" and not verdict.blocked
    assert verdict.updated_input == {"code": "print('rewritten')"}
    assert verdict.context == "the tests live in tests/"
    deny = {"hookSpecificOutput": {"permissionDecision": "deny", "permissionDecisionReason": "not on main"}}
    stop = {"continue": False, "stopReason": "the build is red"}
    both = Hooks.of([("user", HooksFile.model_validate(command("PreToolUse", f"echo {shlex.quote(json.dumps(d))}")))
                     for d in (deny, stop, out)], project)
    verdict = await both.run("PreToolUse", {"tool_name": "ipython"}, target="ipython")
    assert verdict.permission == "deny" and verdict.blocked and verdict.reason == "not on main"
    assert verdict.stop == "the build is red"


async def test_plain_stdout_is_context_only_where_the_event_takes_it(project: Path):
    for event, expected in (("UserPromptSubmit", "today is a Tuesday"), ("PostToolUse", "")):
        verdict = await hooks(project, command(event, "echo today is a Tuesday")).run(event, {})  # type: ignore[arg-type]
        assert verdict.context == expected


async def test_matchers_are_regular_expressions_over_the_whole_name(project: Path):
    config = {"hooks": {"PreToolUse": [
        {"matcher": "ipython", "hooks": [{"type": "command", "command": "echo exact"}]},
        {"matcher": "mcp__github__.*", "hooks": [{"type": "command", "command": "echo github"}]},
        {"matcher": "Bash|ipython", "hooks": [{"type": "command", "command": "echo either"}]},
        {"matcher": "*", "hooks": [{"type": "command", "command": "echo all"}]},
        {"matcher": "ipy", "hooks": [{"type": "command", "command": "echo partial"}]},
    ]}}
    h = hooks(project, config)
    assert [s.command for _, s in h.matching("PreToolUse", "ipython")] == ["echo exact", "echo either", "echo all"]
    assert [s.command for _, s in h.matching("PreToolUse", "mcp__github__create_issue")] == ["echo github", "echo all"]
    assert h.matching("PostToolUse", "ipython") == []


async def test_a_hook_past_its_timeout_is_killed_with_what_it_started(project: Path, tmp_path: Path):
    pid_file = tmp_path / "child.pid"
    h = hooks(project, command("Stop", f"sleep 300 & echo $! > {pid_file}; wait", timeout=1))
    began = time.monotonic()
    verdict = await h.run("Stop", {})
    run, = verdict.runs
    assert run.timed_out and run.error == "killed after its 1 s timeout" and not verdict.blocked
    assert time.monotonic() - began < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
            if "\nState:\tZ" in Path(f"/proc/{child}/status").read_text():
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the hook's background child {child} is still running")


def test_a_claude_code_settings_file_copied_verbatim_reads(tmp_path: Path):
    settings = {
        "permissions": {"allow": ["Bash(npm run lint)"]},
        "hooks": {"PostToolUse": [{"matcher": "Edit|Write|ipython", "hooks": [
            {"type": "command", "command": "\"$CLAUDE_PROJECT_DIR\"/.claude/hooks/format.sh", "timeout": 30}]}],
            "Notification": [{"hooks": [{"type": "command", "command": "notify-send 'Claude Code' 'Awaiting input'"}]}]},
    }
    f = read(tmp_path / "settings.json", json.dumps(settings))
    assert f.hooks["PostToolUse"][0].hooks[0].timeout == 30
    with pytest.raises(HooksError, match="hooks.PreToolUse"):
        read(tmp_path / "bad.json", json.dumps({"hooks": {"PreToolUse": [{"matcher": 1}]}}))
    with pytest.raises(HooksError, match="hooks.Whenever"):
        read(tmp_path / "bad.json", json.dumps({"hooks": {"Whenever": []}}))
