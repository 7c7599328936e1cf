"""A command the sandbox denies, run outside it only once the user approves: the round trip over the
API, as the app and any client make it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from agent.approvals import covers, prefix_of
from agent.layout import SessionLayout
from agent.kernel.sandbox import unavailable
from agent.testing.openai_server import OpenAIServer, Reply
from agent.trajectory import ApprovalRecord, read_records
from daemon.client import Client, DaemonError

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")


async def turn(client: Client, sid: str, code: str, decision: str | None, after: int) -> list:
    """Run `code` in a turn; answer its approval request with `decision`; the turn's events."""
    accepted = await client.send(sid, "run: " + code)
    events = []
    async for e in client.events(sid, after):
        events.append(e)
        if e.type == "approval.requested" and decision is not None:
            await client.approve(sid, e.request_id, decision)
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            return events
    raise AssertionError("unreachable")


async def test_denied_the_model_is_told_approved_it_ran_outside_and_always_approves_the_prefix(
        daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    assert s.sandbox == "workspace-write"
    ask = "r = await request_permission('touch .git/approved', 'to mark the repository')\nprint(r)"

    denied = await turn(daemon, s.id, "open('.git/x', 'w')\n", None, 0)  # what the sandbox says first
    assert "Read-only file system" in denied[-1].answer
    events = await turn(daemon, s.id, ask, "deny", denied[-1].seq)
    requested = next(e for e in events if e.type == "approval.requested")
    assert (requested.kind, requested.summary, requested.prefix) == ("command", "touch .git/approved", "touch")
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by, decided.exit_code) == ("deny", "user", None)
    assert "PermissionError: not run outside the sandbox: the user denied it" in events[-1].answer
    assert not (project / ".git" / "approved").exists()

    events = await turn(daemon, s.id, ask, "always", events[-1].seq)
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by, decided.exit_code) == ("always", "user", 0)
    assert "[ran outside the sandbox: exit code 0]" in events[-1].answer
    assert (project / ".git" / "approved").exists()

    again = "print(await request_permission('touch .git/again'))"
    events = await turn(daemon, s.id, again, None, events[-1].seq)  # nobody decides: the rule does
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by) == ("always", "rule") and (project / ".git" / "again").exists()
    chained = "print(await request_permission('touch .git/b; touch .git/c'))"
    events = await turn(daemon, s.id, chained, "deny", events[-1].seq)  # a chain is never a rule's
    assert next(e for e in events if e.type == "approval.decided").by == "user"
    assert not (project / ".git" / "b").exists()

    with pytest.raises(DaemonError) as e:
        await daemon.approve(s.id, "a-nothing", "approve")
    assert e.value.status == 404 and "no approval request" in e.value.message
    with pytest.raises(DaemonError) as e:
        await daemon.approve(s.id, "a-nothing", "maybe")
    assert e.value.status == 422

    records = [r for r in read_records(SessionLayout(Path(s.dir)).trajectory, []) if isinstance(r, ApprovalRecord)]
    assert [r.status for r in records] == ["requested", "deny", "requested", "always", "requested", "always",
                                           "requested", "deny"]
    assert {r.request_kind for r in records} == {"command"} and records[0].summary == "touch .git/approved"


def parent_and_child(request: dict) -> Reply:
    """The model: the parent starts a subagent `marker`, whose cell asks to run a command outside the sandbox."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content="done: " + messages[-1]["content"])
    if "You are `marker`, started by a parent agent" in messages[0]["content"]:
        return Reply(code=["r = await request_permission('touch .git/approved', 'to mark the repository')\n"
                           "final(str(r.exit_code))"])
    return Reply(code=["print(await (await rlm('mark the repository', name='marker')))"])


async def test_a_subagents_request_is_decided_in_its_parents_session(daemon: Client, project: Path):
    with OpenAIServer(parent_and_child) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        accepted = await daemon.send(s.id, "mark it, through a subagent")
        events = []
        async for e in daemon.events(s.id, 0):
            events.append(e)
            if e.type == "approval.requested":
                await daemon.approve(s.id, e.request_id, "approve")
            if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
                break
    requested = next((e for e in events if e.type == "approval.requested"), events[-1])
    assert requested.type == "approval.requested", requested
    assert requested.summary == "touch .git/approved" and "subagent marker" in requested.reason, requested
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by, decided.exit_code) == ("approve", "user", 0)
    assert (project / ".git" / "approved").exists() and events[-1].answer == "done: 0", events[-1]
    records = [r for r in read_records(SessionLayout(Path(s.dir)).trajectory, []) if isinstance(r, ApprovalRecord)]
    assert [r.status for r in records] == ["requested", "approve"]


async def test_always_on_python_m_pytest_does_not_approve_python_evil_py(daemon: Client, project: Path, model_server):
    """Finding 10: `always` on `python3 -m pytest` made the rule `python3`, and the agent's own
    `python3 evil.py` then ran outside the sandbox unasked."""
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    plant = ("open('evil.py', 'w').write(\"open('pwned', 'w').write('ran outside')\\n\")\n"
             "print(await request_permission('python3 -m pytest --version'))")
    events = await turn(daemon, s.id, plant, "always", 0)
    requested = next(e for e in events if e.type == "approval.requested")
    assert requested.prefix == "python3 -m pytest"  # what the card and the terminal show `always` covers
    assert next(e for e in events if e.type == "approval.decided").by == "user"

    events = await turn(daemon, s.id, "print(await request_permission('python3 -m pytest -q --co'))", None,
                        events[-1].seq)
    assert next(e for e in events if e.type == "approval.decided").by == "rule"  # the rule still works
    for attack in ("python3 evil.py", "python3 -m pytest.evil", "python3 -c 'import evil'", "env python3 evil.py",
                   "PYTHONSTARTUP=evil.py python3 -m pytest"):
        events = await turn(daemon, s.id, f"print(await request_permission({attack!r}))", "deny", events[-1].seq)
        requested = next((e for e in events if e.type == "approval.requested"), None)
        assert requested is not None, (attack, events[-1])  # asked again: the person decides
        assert next(e for e in events if e.type == "approval.decided").by == "user", attack
    assert not (project / "pwned").exists()

    accepted = await daemon.send(s.id, "run: print(await request_permission('python3 evil.py'))")
    async for e in daemon.events(s.id, events[-1].seq):  # nor can a person widen `always` to the interpreter
        if e.type == "approval.requested":
            for wider in ("python3", "python3 -m"):
                with pytest.raises(DaemonError) as refused:
                    await daemon.approve(s.id, e.request_id, "always", prefix=wider)
                assert refused.value.status == 400 and "prefix" in refused.value.message, refused.value.message
            await daemon.approve(s.id, e.request_id, "deny")
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            break
    assert not (project / "pwned").exists()


async def test_an_approved_command_gets_the_kernels_environment_unless_the_person_asks(
        daemon: Client, project: Path, model_server, monkeypatch: pytest.MonkeyPatch):
    """Finding 10: an approved `env` printed the daemon's OPENAI_API_KEY (and every other secret)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret-0123456789")
    monkeypatch.setenv("DEPLOY_TOKEN", "tok-host-secret-9876543210")
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    after = 0
    for command in ("env", "printenv", "printenv OPENAI_API_KEY DEPLOY_TOKEN; env | grep -i secret"):
        code = f"r = await request_permission({command!r})\nprint(r.exit_code, r.stdout)"
        events = await turn(daemon, s.id, code, "approve", after)
        after = events[-1].seq
        assert events[-1].answer.startswith("ran: "), events[-1].answer
        assert "host-secret" not in events[-1].answer, command
        if command == "env":  # it ran, and `always` is not offered for a launcher
            assert "PATH=" in events[-1].answer
            assert next(e for e in events if e.type == "approval.requested").prefix is None

    accepted = await daemon.send(s.id, "run: print((await request_permission('printenv DEPLOY_TOKEN')).stdout)")
    async for e in daemon.events(s.id, after):  # the person asked for their full environment: this once
        if e.type == "approval.requested":
            decided = await daemon.approve(s.id, e.request_id, "approve", full_env=True)
            assert decided.full_env is True
        if e.type == "approval.decided":
            assert e.full_env is True
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            break
    assert "tok-host-secret-9876543210" in e.answer
    records = [r for r in read_records(SessionLayout(Path(s.dir)).trajectory, []) if isinstance(r, ApprovalRecord)]
    assert [r.full_env for r in records if r.status == "approve"] == [False, False, False, True]


@pytest.mark.parametrize("sandbox", ["workspace-write", "full-access"])
async def test_a_git_repository_the_agent_made_is_named_and_no_rule_runs_git_in_it(daemon: Client, tmp_path: Path,
                                                                                 model_server, sandbox: str):
    """Finding 11: in a workspace that is not a repository a cell made `.git` with `core.fsmonitor`;
    the person approving `git status` (or an earlier `always` for it) ran the planted command."""
    workspace = tmp_path / "fresh"
    workspace.mkdir()
    pwned = tmp_path / "pwned"
    s = await daemon.create_session(workspace, model="fake", base_url=model_server.base_url, sandbox=sandbox)
    events = await turn(daemon, s.id, "print(await request_permission('git status'))", "always", 0)
    requested = next(e for e in events if e.type == "approval.requested")
    assert (requested.prefix, requested.notes) == ("git status", [])

    plant = ("import subprocess\n"
             "try:\n"
             "    subprocess.run(['git', 'init', '-q'], check=True)\n"
             f"    subprocess.run(['git', 'config', 'core.fsmonitor', 'touch {pwned}; false'], check=True)\n"
             "except (OSError, subprocess.CalledProcessError) as e:\n"
             "    print('could not plant:', e)\n")
    events = await turn(daemon, s.id, plant, None, events[-1].seq)
    made = (workspace / ".git" / "config").exists()
    assert made == (sandbox == "full-access")  # the sandbox covers an absent .git
    events = await turn(daemon, s.id, "print(await request_permission('git status'))", "deny" if made else None,
                        events[-1].seq)
    if made:  # the sandbox let the cell make it: the request must say so, and no rule may decide it
        requested = next((e for e in events if e.type == "approval.requested"), None)
        assert requested is not None, "an earlier `always` ran git in the agent's repository unasked"
        assert len(requested.notes) == 1 and str(workspace / ".git") in requested.notes[0], requested.notes
        assert "core.fsmonitor" in requested.notes[0]
        assert next(e for e in events if e.type == "approval.decided").by == "user"
    assert not pwned.exists()


@pytest.mark.parametrize(("command", "rule"), [
    ("python3 -m pytest -q tests", "python3 -m pytest"), ("python3 evil.py", "python3 evil.py"), ("python3", None),
    ("python3 -c 'import os'", None), ("bash -c 'id'", None), ("npm run build", "npm run build"),
    ("uv run python -m pytest", "uv run python -m pytest"), ("npx prettier --write .", "npx prettier"),
    ("git push --force", "git push"), ("git -c core.fsmonitor=x status", None), ("env", None),
    ("sudo apt install x", None), ("timeout 10 python3 x.py", None), ("docker exec box sh -c id", None),
    ("touch a; rm -rf b", None), ("ls -la", "ls"), ("FOO=1 make test", "FOO=1 make test"),
])
def test_what_always_covers(command: str, rule: str | None):
    """What the card offers for `always`; and a rule covers later commands no wider than itself."""
    assert prefix_of(command) == rule
    if rule is not None:
        assert covers(shlex.split(rule), command)
    assert not covers(["python3"], "python3 evil.py") and not covers(["npm"], "npm run evil")
    assert covers(["git", "push"], "git push --force")  # decided: arguments after the subcommand are covered
