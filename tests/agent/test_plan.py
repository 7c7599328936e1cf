"""Plan mode through real sessions: the workspace is read-only to everything the kernel starts until a
person approves the plan; then the same kernel, its variables kept, writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent import events as ev
from agent.config import load_config
from agent.kernel.sandbox import unavailable
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import PlanRecord, read_records

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"no sandbox here: {unavailable()}")

ESCAPES = """
import os, shutil, subprocess, pathlib
tried = {}
def attempt(name, f):
    try:
        f(); tried[name] = 'WROTE'
    except Exception as e:
        tried[name] = type(e).__name__
attempt('open', lambda: open('new.txt', 'w').write('x'))
attempt('append', lambda: open('app.py', 'a').write('# planted'))
attempt('rename', lambda: os.rename('app.py', 'moved.py'))
attempt('remove', lambda: os.remove('app.py'))
attempt('mkdir', lambda: os.mkdir('made'))
attempt('symlink', lambda: os.symlink('/etc/passwd', 'link'))
attempt('chmod', lambda: os.chmod('app.py', 0o777))
attempt('shell', lambda: subprocess.run('echo x > shell.txt', shell=True, check=True))
attempt('copy', lambda: shutil.copy('app.py', 'copy.py'))
attempt('tmp', lambda: open(os.path.join(os.environ['TMPDIR'], 'scratch'), 'w').write('ok'))
plan_context = 'app.py has 1 line'
print(tried)
"""


def planning(project: Path, outputs: list, events: list | None = None) -> Session:
    config = load_config(project, {"kernel": {"interrupt_grace": 1.0}, "sandbox": {"plan": True}})
    return Session(config, ScriptedModel(outputs), cwd=project, on_event=events.append if events is not None else None)


def files(project: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in project.iterdir() if p.is_file()}


async def test_nothing_is_written_before_approval_and_the_same_kernel_writes_after(project: Path):
    (project / "app.py").write_text("print('hi')\n")
    before = files(project)
    events: list = []
    script = [cells(ESCAPES), cells("propose_plan('1. add a docstring to app.py\\n2. run it')"),
              cells("open('app.py', 'w').write('\"\"\"' + plan_context + '\"\"\"\\nprint(\"hi\")\\n')",
                    "print(open('app.py').read())"), "done"]
    async with planning(project, script, events) as s:
        await s.prompt("add a docstring")
        first = next(m.content for m in s.context.messages if m.role == "tool")  # the escapes' output
        tried = eval(first.splitlines()[0])
        assert tried.pop("tmp") == "WROTE"  # its own temp folder stays writable
        assert set(tried.values()) <= {"OSError", "PermissionError", "CalledProcessError"}, tried
        assert files(project) == before and not (project / "made").exists() and not (project / "link").exists()
        assert s.plan == "1. add a docstring to app.py\n2. run it" and s.last_result.answer == s.plan
        assert any(isinstance(e, ev.PlanProposed) for e in events)
        assert "Plan mode" in s.model.calls[0][-1].content  # the model was told
        follow = await s.decide_plan(True)
        assert "approved" in follow and s.plan is None and not s.planning
        await s.prompt(follow)
        assert (project / "app.py").read_text() == '"""app.py has 1 line"""\nprint("hi")\n'  # a variable of before
    steps = [(r.step, r.plan) for r in read_records(s.layout.trajectory, []) if isinstance(r, PlanRecord)]
    plan = "1. add a docstring to app.py\n2. run it"
    assert steps == [("proposed", plan), ("approved", plan)]


async def test_a_rejected_plan_keeps_the_workspace_read_only_and_the_model_hears_the_note(project: Path):
    script = [cells("propose_plan('delete everything')"),
              cells("import os\ntry:\n    open('x', 'w')\nexcept OSError as e:\n    print('still read-only')"), "ok"]
    async with planning(project, script) as s:
        await s.prompt("clean up")
        assert await s.decide_plan(False, note="never delete the fixtures") is None
        await s.prompt("try again")
        sent = s.model.calls[1][-1].content
        assert "The user rejected your plan: never delete the fixtures" in sent
        assert "still read-only" in s.model.calls[-1][-1].content and not (project / "x").exists()
        with pytest.raises(ValueError, match="no plan waits"):
            await s.decide_plan(True)


async def test_a_session_resumed_after_its_plan_was_approved_is_writable_whatever_its_config_says(project: Path):
    """The approved record is plan mode's one truth: a process that died before it could note the
    approval anywhere else (its follow-up turn unsent) resumes writable, the model told of the plan."""
    async with planning(project, [cells("propose_plan('write w.txt')"), "proposed"]) as s:
        await s.prompt("plan it")
        await s.decide_plan(True, note="fine")
    records = read_records(s.layout.trajectory)
    config = load_config(project, {"kernel": {"interrupt_grace": 1.0}, "sandbox": {"plan": True}})
    again = Session(config, ScriptedModel([cells("open('w.txt', 'w').write('w')"), "done"]), cwd=project,
                    session_dir=s.dir, session_id=s.id)
    again.resume(records, "The process ended")
    assert not again.planning and again.plan is None
    async with again:
        await again.prompt("go on")
        told = again.model.calls[0][-1].content
        assert "The user approved your plan (fine)" in told and "write w.txt" in told
    assert (project / "w.txt").read_text() == "w"


async def test_plan_mode_needs_the_sandbox(project: Path):
    config = load_config(project, {"sandbox": {"plan": True, "mode": "full-access"}})
    with pytest.raises(Exception, match="plan mode keeps the workspace read-only"):
        async with Session(config, ScriptedModel([]), cwd=project):
            pass


def test_run_prints_the_plan_and_exits_0_or_carries_it_out_with_approve_plan(project: Path, tmp_path: Path):
    import subprocess

    from agent.testing.openai_server import OpenAIServer, Reply

    def model(request: dict) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(content="ok")
        if "approved your plan" in (last.get("content") or ""):
            return Reply(code=["open('done.txt', 'w').write('carried out')"])
        return Reply(code=["propose_plan('write done.txt')"])

    prime_agent = str(Path(sys.executable).parent / "prime-agent")
    with OpenAIServer(model) as server:
        args = [prime_agent, "run", "--model", "fake", "--base-url", server.base_url, "--permission-mode", "plan"]
        shown = subprocess.run([*args, "write a file"], capture_output=True, text=True, cwd=project, timeout=300)
        assert shown.returncode == 0 and shown.stdout.strip() == "write done.txt" and not (project / "done.txt").exists()
        done = subprocess.run([*args, "--approve-plan", "write a file"], capture_output=True, text=True, cwd=project,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert (project / "done.txt").read_text() == "carried out"
