"""A command the sandbox denies, run outside it only once the user approves: the round trip over the
API, as the app and any client make it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
            await client.decide_approval(sid, e.request_id, decision)
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            return events
    raise AssertionError("unreachable")


async def test_denied_the_model_is_told_approved_it_ran_and_always_approves_what_the_card_said(
        daemon: Client, tmp_path: Path, model_server):
    project = person_repository(tmp_path / "repo")
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    assert s.sandbox == "workspace-write"
    ask = "r = await request_permission('git commit -q --allow-empty -m one', 'to commit')\nprint(r)"

    denied = await turn(daemon, s.id, "open('.git/x', 'w')\n", None, 0)  # what the sandbox says first
    assert "Read-only file system" in denied[-1].answer
    events = await turn(daemon, s.id, ask, "deny", denied[-1].seq)
    requested = next(e for e in events if e.type == "approval.requested")
    assert (requested.kind, requested.summary, requested.prefix) == (
        "command", "git commit -q --allow-empty -m one", "git commit -q --allow-empty -m … (the same options; any "
        "paths and message)")
    assert "its repository (.git)" in requested.runs_in and requested.notes == []
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by, decided.exit_code) == ("deny", "user", None)
    assert "PermissionError: not approved: the user denied it" in events[-1].answer
    assert commits(project) == ["start"]

    events = await turn(daemon, s.id, ask, "always", events[-1].seq)
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by, decided.exit_code) == ("always", "user", 0)
    assert "[approved and run: exit code 0]" in events[-1].answer and commits(project) == ["one", "start"]

    again = "print(await request_permission('git commit -m two --allow-empty -q'))"
    events = await turn(daemon, s.id, again, None, events[-1].seq)  # nobody decides: the rule does
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by) == ("always", "rule") and commits(project) == ["two", "one", "start"]
    for wider in ("git commit -q --allow-empty -m three; touch .git/c", "git commit -q --allow-empty -m three -n"):
        events = await turn(daemon, s.id, f"print(await request_permission({wider!r}))", "deny", events[-1].seq)
        assert next(e for e in events if e.type == "approval.decided").by == "user", wider  # asked again
    assert commits(project) == ["two", "one", "start"] and not (project / ".git" / "c").exists()

    with pytest.raises(DaemonError) as e:
        await daemon.decide_approval(s.id, "a-nothing", "approve")
    assert e.value.status == 404 and "no approval request" in e.value.message
    with pytest.raises(DaemonError) as e:
        await daemon.decide_approval(s.id, "a-nothing", "maybe")
    assert e.value.status == 422

    records = [r for r in read_records(SessionLayout(Path(s.dir)).trajectory, []) if isinstance(r, ApprovalRecord)]
    assert [r.status for r in records] == ["requested", "deny", "requested", "always", "requested", "always",
                                           "requested", "deny", "requested", "deny"]
    assert {r.request_kind for r in records} == {"command"} and records[0].summary == "git commit -q --allow-empty -m one"


def person_repository(path: Path) -> Path:
    """A repository the person made, with one commit."""
    path.mkdir()
    for args in (["init", "-q"], ["config", "user.name", "P"], ["config", "user.email", "p@example.com"],
                 ["commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    return path


def commits(repository: Path) -> list[str]:
    return subprocess.run(["git", "log", "--format=%s"], cwd=repository, capture_output=True, text=True,
                          check=True).stdout.split()


def parent_and_child(request: dict) -> Reply:
    """The model: the parent starts a subagent `marker`, whose cell asks to run a command outside the sandbox."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content="done: " + messages[-1]["content"])
    if "You are `marker`, started by a parent agent" in messages[0]["content"]:
        return Reply(code=["r = await request_permission('git init -q', 'to make the repository')\n"
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
                await daemon.decide_approval(s.id, e.request_id, "approve")
            if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
                break
    requested = next((e for e in events if e.type == "approval.requested"), events[-1])
    assert requested.type == "approval.requested", requested
    assert requested.summary == "git init -q" and "subagent marker" in requested.reason, requested
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.decision, decided.by, decided.exit_code) == ("approve", "user", 0)
    assert (project / ".git" / "HEAD").exists() and events[-1].answer == "done: 0", events[-1]
    records = [r for r in read_records(SessionLayout(Path(s.dir)).trajectory, []) if isinstance(r, ApprovalRecord)]
    assert [r.status for r in records] == ["requested", "approve"]


async def test_no_always_for_an_interpreter_whatever_prefix_the_person_gives(daemon: Client, project: Path,
                                                                              model_server):
    """Finding 10 and E7: `always` on `python3 -m pytest` made a rule, and the agent's own `python3
    evil.py`, or a `pytest.py` it planted for `-m` to import, then ran unasked. No interpreter has a
    rule now, whatever prefix the API is given; each later run is the person's to decide."""
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    plant = ("open('evil.py', 'w').write(\"open('pwned', 'w').write('ran')\\n\")\n"
             "print(await request_permission('python3 -m pytest --version'))")
    accepted = await daemon.send(s.id, "run: " + plant)
    async for e in daemon.events(s.id, 0):
        if e.type == "approval.requested":
            assert e.prefix is None  # what the card and the terminal offer: no `always`
            for prefix in (None, "python3 -m pytest", "python3"):
                with pytest.raises(DaemonError) as refused:
                    await daemon.decide_approval(s.id, e.request_id, "always", prefix=prefix)
                assert refused.value.status == 400 and "not offered" in refused.value.message, refused.value.message
            await daemon.decide_approval(s.id, e.request_id, "approve")
        if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
            break
    assert "[approved and run: exit code" in e.answer, e.answer
    for attack in ("python3 -m pytest --version", "python3 evil.py", "python3 -m pytest.evil",
                   "python3 -c 'import evil'", "env python3 evil.py", "PYTHONSTARTUP=evil.py python3 -m pytest"):
        events = await turn(daemon, s.id, f"print(await request_permission({attack!r}))", "deny", e.seq)
        e = events[-1]
        assert next(x for x in events if x.type == "approval.decided").by == "user", attack  # asked again
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
            decided = await daemon.decide_approval(s.id, e.request_id, "approve", full_env=True)
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
    unconfined = ["it runs with your rights, unconfined: the sandbox is off (full-access)"]
    assert (requested.prefix, requested.notes) == ("git status", unconfined if sandbox == "full-access" else [])

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
        assert len(requested.notes) == 2 and str(workspace / ".git") in requested.notes[0], requested.notes
        assert "core.fsmonitor" in requested.notes[0] and requested.notes[1:] == unconfined
        assert next(e for e in events if e.type == "approval.decided").by == "user"
    assert not pwned.exists()
