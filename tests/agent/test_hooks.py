"""The hooks engine with real hook commands (sh, python): what they get on stdin, and what their
exit codes and JSON decide."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from agent.config import home, project_root
from agent.hooks import EVENTS, HookRun, Hooks, HooksError, HooksFile, read
from agent.hostrun import Host, Untrusted


def host(project: Path) -> Host:
    return Host(home(), project_root(project), project.resolve())


def hooks(project: Path, config: dict, source: str = "user") -> Hooks:
    return Hooks.of([(source, HooksFile.model_validate(config))], host(project))


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
                  ("user", HooksFile.model_validate(command("PreToolUse", "echo oops >&2; exit 1")))], host(project))
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
                     for d in (deny, stop, out)], host(project))
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


# --- through real sessions: a scripted model, real kernels, the person's hooks files ----------------

from agent import events as ev  # noqa: E402
from agent.config import load_config  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.scripted import ScriptedModel, cells  # noqa: E402
from agent.trajectory import HookRecord, read_records  # noqa: E402
from tests.conftest import trust  # noqa: E402

READ = "python3 -c \"import json, sys; d = json.load(sys.stdin); {}\""
"""A hook command in Python: `d` is the event's input."""


def user_hooks(config: dict) -> None:
    (home() / "hooks.json").parent.mkdir(parents=True, exist_ok=True)
    (home() / "hooks.json").write_text(json.dumps(config))


def hooked(project: Path, outputs: list, events: list | None = None) -> Session:
    config = load_config(project, {"kernel": {"interrupt_grace": 1.0}})
    return Session(config, ScriptedModel(outputs), cwd=project, on_event=events.append if events is not None else None)


def tool_output(s: Session) -> str:
    return next(m.content for m in reversed(s.model.calls[-1]) if m.role == "tool")


async def test_pre_tool_use_exit_2_keeps_the_cell_from_running_and_the_model_reads_why(project: Path):
    user_hooks(command("PreToolUse", READ.format(
        "sys.exit(0) if 'rm -rf' not in d['tool_input']['code'] else (print('no rm -rf here', file=sys.stderr), "
        "sys.exit(2))"), matcher="ipython"))
    async with hooked(project, [cells("import subprocess; open('ran', 'w'); subprocess.run('rm -rf x', shell=True)"),
                                "ok"]) as s:
        await s.prompt("clean up")
        assert not (project / "ran").exists()
        assert "BlockedByHook: a PreToolUse hook kept this cell from running: no rm -rf here" in tool_output(s)
        run, = [r.run for r in read_records(s.layout.trajectory, []) if isinstance(r, HookRecord)]
        assert (run.event, run.source, run.exit_code) == ("PreToolUse", "user", 2)


async def test_updated_input_changes_the_code_that_runs_and_post_tool_use_sees_its_output(project: Path,
                                                                                        tmp_path: Path):
    seen = tmp_path / "post.json"
    rewrite = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                      "updatedInput": {"code": "print('rewritten')"}}}
    user_hooks({"hooks": {
        "PreToolUse": [{"matcher": "ipython", "hooks": [{"type": "command", "command": f"echo {shlex.quote(json.dumps(rewrite))}"}]}],
        "PostToolUse": [{"hooks": [{"type": "command", "command": f"cat > {seen}; echo 'formatted 1 file' >&2; exit 2"}]}],
    }})
    async with hooked(project, [cells("print('original')"), "ok"]) as s:
        await s.prompt("go")
        out = tool_output(s)
        assert out.startswith("rewritten") and "[hook] formatted 1 file" in out
    post = json.loads(seen.read_text())
    assert (post["hook_event_name"], post["tool_name"], post["tool_input"]) == (
        "PostToolUse", "ipython", {"code": "print('rewritten')"})
    assert post["tool_response"]["stdout"] == "rewritten\n" and post["session_id"] == s.id
    assert post["transcript_path"] == str(s.layout.trajectory) and post["permission_mode"] == "workspace-write"


async def test_permission_decision_ask_raises_the_approval_card_and_its_answer_decides(project: Path):
    ask = {"hookSpecificOutput": {"permissionDecision": "ask", "permissionDecisionReason": "it writes files"}}
    user_hooks(command("PreToolUse", f"echo {shlex.quote(json.dumps(ask))}"))
    events: list = []
    async with hooked(project, [cells("open('first', 'w')"), cells("open('second', 'w')"), "ok"], events) as s:
        s.approvals.can_ask = True

        def answer(e) -> None:
            if isinstance(e, ev.ApprovalRequested):  # as the app's card does, once the request waits
                asyncio.get_running_loop().call_soon(s.approvals.decide, e.request_id,
                                                     "approve" if "first" in e.summary else "deny")
        s.listeners.append(answer)
        await s.prompt("go")
    requested = [e for e in events if isinstance(e, ev.ApprovalRequested)]
    assert [(e.kind, e.reason, e.prefix) for e in requested] == [("cell", "it writes files", None)] * 2
    assert (project / "first").exists() and not (project / "second").exists()


async def test_user_prompt_submit_adds_context_or_refuses_the_prompt(project: Path):
    user_hooks(command("UserPromptSubmit", READ.format(
        "(print('no prompts about prod', file=sys.stderr), sys.exit(2)) if 'prod' in d['prompt'] "
        "else print('The tracker says: ISSUE-7 is open')")))
    async with hooked(project, ["fine", "never"]) as s:
        await s.prompt("what is open?")
        assert "The tracker says: ISSUE-7 is open" in s.model.calls[-1][-1].content
        refused = await s.prompt("deploy to prod")
        assert refused.outcome == "error" and "no prompts about prod" in (refused.error or "")
        assert len(s.model.calls) == 1 and not any("prod" in m.content for m in s.context.messages)


async def test_a_stop_hook_with_exit_2_makes_the_turn_go_on_once(project: Path):
    user_hooks(command("Stop", READ.format(
        "sys.exit(0) if d['stop_hook_active'] else (print('run the tests first', file=sys.stderr), sys.exit(2))")))
    async with hooked(project, ["done", "tests pass, done"]) as s:
        result = await s.prompt("fix it")
        assert result.answer == "tests pass, done"
        assert "[A Stop hook asks you to go on]\nrun the tests first" in s.model.calls[-1][-1].content


async def test_a_hook_past_its_timeout_is_killed_and_the_turn_completes(project: Path):
    user_hooks(command("PreToolUse", "sleep 60", timeout=1))
    async with hooked(project, [cells("print('ran')"), "ok"]) as s:
        began = time.monotonic()
        result = await s.prompt("go")
        assert result.outcome == "completed" and tool_output(s).startswith("ran")
        assert time.monotonic() - began < 50
        run, = [r.run for r in read_records(s.layout.trajectory, []) if isinstance(r, HookRecord)]
        assert run.timed_out and run.error == "killed after its 1 s timeout"


async def test_a_project_hooks_file_runs_only_once_a_person_trusted_it(tmp_path: Path):
    """A fresh project with no .prime-agent: a cell (in full-access, the only mode in which a cell can
    write .prime-agent/) plants hooks.json; the next session names it and runs nothing, until trusted."""
    project = tmp_path / "fresh"
    project.mkdir()
    marker = tmp_path / "pwned"
    plant = json.dumps(command("SessionStart", f"touch {marker}; echo planted context"))
    config = load_config(project, {"sandbox": {"mode": "full-access"}})
    async with Session(config, ScriptedModel([cells(f"import os; os.makedirs('.prime-agent', exist_ok=True); "
                                                    f"open('.prime-agent/hooks.json', 'w').write({plant!r})"), "ok"]),
                       cwd=project) as s:
        await s.prompt("plant")
    assert (project / ".prime-agent" / "hooks.json").exists() and not marker.exists()
    async with hooked(project, ["nothing ran"]) as s:
        assert any(".prime-agent/hooks.json" in line for line in s.ignored)
        await s.prompt("hello")
        assert not marker.exists() and "planted context" not in s.model.calls[-1][-1].content
    trust(project, ".prime-agent/hooks.json")
    async with hooked(project, ["it ran"]) as s:
        await s.prompt("hello")
        assert marker.exists() and "planted context" in s.model.calls[-1][-1].content


async def test_every_event_reaches_its_hooks_in_claude_codes_shape(project: Path, tmp_path: Path):
    """SessionStart, UserPromptSubmit, PreToolUse, PostToolUse and its failure, PreCompact (a person's
    /compact), PermissionRequest (whose allow runs the command without asking anyone), Notification
    (the approval), Stop and SessionEnd, each with the fields Claude Code sends."""
    log = tmp_path / "events.jsonl"
    record = f"python3 -c \"import sys; open({str(log)!r}, 'a').write(sys.stdin.read() + chr(10))\""
    allow = {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "permissionDecision": "allow"}}
    config = {"hooks": {e: [{"hooks": [{"type": "command", "command": record}]}]
                        for e in EVENTS if not e.startswith("Subagent")}}
    config["hooks"]["PermissionRequest"][0]["hooks"].append({"type": "command",
                                                            "command": f"echo {shlex.quote(json.dumps(allow))}"})
    user_hooks(config)
    loaded = load_config(project, {"kernel": {"interrupt_grace": 1.0}, "compaction": {"keep_recent_turns": 0}})
    script = [cells("1 / 0"), "first", "the first turn divided by zero",
              cells("print((await request_permission('echo hi', 'to greet')).stdout)"), "second"]
    async with Session(loaded, ScriptedModel(script), cwd=project) as s:
        await s.prompt("one")
        s.request_compaction()
        second = await s.prompt("two")
        assert "hi" in tool_output(s) and second.outcome == "completed"
    seen = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    by = {}
    for e in seen:
        by.setdefault(e["hook_event_name"], []).append(e)
    assert set(by) == {e for e in EVENTS if not e.startswith("Subagent")}, sorted(by)
    for e in seen:
        assert (e["session_id"], e["cwd"], e["transcript_path"]) == (s.id, str(project), str(s.layout.trajectory))
    assert by["SessionStart"][0]["source"] == "startup" and by["SessionEnd"][0]["reason"] == "other"
    assert [e["prompt"] for e in by["UserPromptSubmit"]] == ["one", "two"]
    assert by["PostToolUseFailure"][0]["tool_response"]["error"].startswith("ZeroDivisionError")
    assert by["PreCompact"][0]["trigger"] == "manual"
    asked = by["PermissionRequest"][0]
    assert (asked["tool_name"], asked["tool_input"]) == ("Bash", {"command": "echo hi", "description": "to greet"})
    assert by["Notification"][0]["notification_type"] == "permission_prompt"
    assert [e["stop_hook_active"] for e in by["Stop"]] == [False, False]
    decided = [r for r in read_records(s.layout.trajectory, []) if getattr(r, "status", None) == "approve"]
    assert decided and decided[0].by == "hook"


async def test_an_http_hook_gets_the_event_posted_and_its_reply_decides(project: Path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            body = json.dumps({"hookSpecificOutput": {"permissionDecision": "deny",
                                                      "permissionDecisionReason": "the policy server says no"}})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        h = hooks(project, {"hooks": {"PreToolUse": [{"hooks": [
            {"type": "http", "url": f"http://127.0.0.1:{server.server_port}/hook"}]}]}})
        verdict = await h.run("PreToolUse", {"tool_name": "ipython", "tool_input": {"code": "1"}}, target="ipython")
    finally:
        server.shutdown()
    assert got == [{"tool_name": "ipython", "tool_input": {"code": "1"}, "hook_event_name": "PreToolUse",
                    "cwd": str(project)}]
    assert verdict.blocked and verdict.reason == "the policy server says no"


async def test_a_stop_hook_that_always_blocks_cannot_spin_the_turn_and_final_is_taken_back(project: Path):
    user_hooks(command("Stop", "echo not yet >&2; exit 2"))
    async with hooked(project, [cells("final('done')"), cells("final('done, really')"), "still done", "done!"]) as s:
        result = await s.prompt("finish")
        assert result.outcome == "completed" and result.answer == "done!"  # the model heard the hook three times
        assert sum("[A Stop hook asks you to go on]" in m.content for m in s.context.messages) == 3


async def test_garbage_from_a_hook_decides_nothing_and_breaks_nothing(project: Path):
    user_hooks({"hooks": {"UserPromptSubmit": [{"hooks": [
        {"type": "command", "command": "echo '{\"hookSpecificOutput\": \"allow\", \"continue\": 1}'"},
        {"type": "http", "url": "http://[::1"}]}]}})
    async with hooked(project, ["fine"]) as s:
        result = await s.prompt("hello")
        assert result.outcome == "completed"
        runs = [r.run for r in read_records(s.layout.trajectory, []) if isinstance(r, HookRecord)]
        assert len(runs) == 2 and any(r.error and "http" in r.command for r in runs)


# --- what a hook runs: never the workspace's, unless a person trusted those bytes ------------------

def runs_of(s: Session) -> dict[str, HookRun]:
    return {r.run.command: r.run for r in read_records(s.layout.trajectory, []) if isinstance(r, HookRecord)}


def fresh(tmp_path: Path) -> Path:
    project = tmp_path / "fresh"
    project.mkdir()
    return project


async def test_modules_a_cell_plants_never_run_in_python_m_hooks(tmp_path: Path):
    """The person's `python3 -m json.tool` and `python3 -m hookmod` hooks; a cell writes json.py and
    hookmod.py into a fresh project. The hooks start in a neutral folder with PYTHONSAFEPATH=1: json.tool
    is the standard library's, hookmod is not found, and neither planted module runs on the host."""
    project, marker = fresh(tmp_path), tmp_path / "pwned"
    plant = f"open({str(marker)!r}, 'a').write(__name__ + ' ran on the host\\n')\n"
    user_hooks({"hooks": {"PostToolUse": [{"hooks": [{"type": "command", "command": "python3 -m json.tool"},
                                                     {"type": "command", "command": "python3 -m hookmod"}]}]}})
    async with hooked(project, [cells(f"for m in ('json', 'hookmod'):\n    open(m + '.py', 'w').write({plant!r})"),
                                "ok"]) as s:
        await s.prompt("go")
    assert (project / "hookmod.py").is_file() and not marker.exists(), marker.read_text()
    runs = runs_of(s)
    assert runs["python3 -m json.tool"].exit_code == 0 and '"tool_name": "ipython"' in runs["python3 -m json.tool"].stdout
    assert runs["python3 -m hookmod"].exit_code == 1 and "No module named hookmod" in runs["python3 -m hookmod"].stderr


async def test_a_tool_a_cell_plants_in_node_modules_never_runs_for_an_npx_hook(tmp_path: Path):
    project, marker = fresh(tmp_path), tmp_path / "pwned"
    user_hooks(command("PostToolUse", "npx --offline --no-install prime-agent-planted-tool"))
    plant = f"#!/bin/sh\necho planted tool ran > {marker}\n"
    async with hooked(project, [cells("import os\nos.makedirs('node_modules/.bin')\n"
                                      f"open('node_modules/.bin/prime-agent-planted-tool', 'w').write({plant!r})\n"
                                      "os.chmod('node_modules/.bin/prime-agent-planted-tool', 0o755)"), "ok"]) as s:
        await s.prompt("go")
    assert (project / "node_modules" / ".bin" / "prime-agent-planted-tool").is_file()
    assert not marker.exists()
    [run] = runs_of(s).values()
    assert run.exit_code not in (0, None), run


async def test_a_hook_script_changed_after_trust_does_not_run_and_one_that_cds_to_the_project_does(tmp_path: Path):
    """The project's hooks.json: SessionStart cds to `$CLAUDE_PROJECT_DIR` and runs `git status`
    (what a person writes, and what works), UserPromptSubmit runs `python3 tools/hook.py`, trusted
    with the file. A cell rewrites the script: it does not run, at the next prompt nor in the next
    session (named at its start), until a person trusts the change."""
    project, marker = fresh(tmp_path), tmp_path / "pwned"
    subprocess.run(["git", "init", "-q", str(project)], check=True)  # the person's repository
    (project / ".prime-agent").mkdir()
    status, script = 'cd "$CLAUDE_PROJECT_DIR" && git status --short', "python3 tools/hook.py"
    (project / ".prime-agent" / "hooks.json").write_text(json.dumps({"hooks": {
        "SessionStart": [{"hooks": [{"type": "command", "command": status}]}],
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": script}]}]}}))
    (project / "tools").mkdir()
    (project / "tools" / "hook.py").write_text("print('the tracker says: ISSUE-7 is open')\n")
    trust(project, ".prime-agent/hooks.json", "tools/hook.py")
    leak = f"import os\nopen({str(marker)!r}, 'w').write(os.environ.get('OPENAI_API_KEY', 'ran'))\n"
    async with hooked(project, [cells(f"open('tools/hook.py', 'w').write({leak!r})"), "planted", "next"]) as s:
        await s.prompt("what is open?")
        told = s.model.calls[0][-1].content
        assert "the tracker says: ISSUE-7 is open" in told and "?? tools/" in told  # both hooks ran
        await s.prompt("and now?")
        assert not marker.exists()
        run = [r.run for r in read_records(s.layout.trajectory, []) if isinstance(r, HookRecord)][-1]
        assert (run.command, run.exit_code) == (script, None)
        assert run.error == ("not run: tools/hook.py (run by a UserPromptSubmit hook (project)) is changed since you "
                             "trusted it, so it does not run until you trust it: prime-agent trust")
    async with hooked(project, ["fine"]) as s:
        assert s.ignored == ["tools/hook.py (run by a UserPromptSubmit hook (project)) is changed since you trusted "
                             "it, so the hook does not run until you trust it: prime-agent trust"]
        await s.prompt("hello")
    assert not marker.exists() and [r.command for r in runs_of(s).values()] == [status]


def test_a_hook_command_line_is_read_for_the_project_files_it_runs(tmp_path: Path):
    """What is pinned is what runs: the command, and what an interpreter runs (its script, a code
    suffix), as sh would read the line; never a file a command only reads or writes."""
    project = fresh(tmp_path)
    for name in ("tools/hook.py", "tools/serve", "data.db", ".claude/hooks/format.sh", "README"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("")
    h = host(project)
    for line, runs in {
        '"$CLAUDE_PROJECT_DIR"/.claude/hooks/format.sh': [".claude/hooks/format.sh"],
        'cd "$CLAUDE_PROJECT_DIR" && python3 tools/hook.py --db data.db > tools/out.py 2>&1': ["tools/hook.py"],
        "cd $PRIME_AGENT_PROJECT_DIR && git add README tools/hook.py && ruff format tools/": [],
        "FOO=1 node --require ./tools/hook.py tools/serve data.db README": ["tools/hook.py", "tools/serve"],
        'echo "$(bash tools/serve)" `python3 tools/hook.py` "$HOME/tools/hook.py"': ["tools/serve", "tools/hook.py"],
        "python3 -c 'import tools.hook' | jq .x  # python3 tools/hook.py": [],
        "uv run 'tools/hook.py'; deno run https://example.com/tools/hook.py": ["tools/hook.py"],
    }.items():
        assert h.pinned(h.shell_words(line)) == runs, line
    with pytest.raises(Untrusted, match=r"^tools/new.py \(a hook\) is absent, so it does not run$"):
        h.shell("python3 tools/new.py", "a hook")  # a cell could write it after the check
    with pytest.raises(Untrusted, match=r"^tools/hook.py \(a hook\) is new, so it does not run until you trust it"):
        h.shell("python3 tools/hook.py", "a hook")
    trust(project, "tools/hook.py")
    copy = home() / "pinned" / hashlib.sha256(b"").hexdigest() / "hook.py"
    assert h.shell('cd "$CLAUDE_PROJECT_DIR" && python3 tools/hook.py data.db', "a hook") == \
        f'cd "$CLAUDE_PROJECT_DIR" && python3 {copy} data.db'
