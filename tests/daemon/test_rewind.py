"""Rewind over the API and the CLI: a real daemon, real kernels, the fake model; and a daemon killed
with SIGKILL in the middle of a rewind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.events import Rewound
from agent.layout import SessionLayout
from agent.trajectory import MessageRecord, RewindRecord, read_records
from daemon.client import Client, DaemonError, SyncClient, daemon_pid
from tests.daemon.conftest import collect

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


async def turn(client: Client, sid: str, text: str):
    after = (await client.session(sid)).last_seq
    accepted = await client.send(sid, text)
    events = await collect(client, sid, accepted.turn_id, after)
    assert events[-1].outcome == "completed", events[-1]
    return events


async def test_rewind_over_the_api_lists_turns_previews_and_restores(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await turn(daemon, s.id, "run: open('a.txt', 'w').write('one'); n = 1")
    await turn(daemon, s.id, "run: open('a.txt', 'w').write('two'); open('b.txt', 'w').write('b'); n = 2")
    rows = await daemon.checkpoints(s.id)
    assert [(r.turn, r.files, r.checkpoint) for r in rows] == [(1, ["a.txt"], True), (2, ["a.txt", "b.txt"], True)]
    assert rows[0].prompt.startswith("run: open('a.txt'") and rows[1].outcome == "completed"

    preview = await daemon.rewind(s.id, 2, dry_run=True)
    assert preview.dry_run and preview.rewind_id is None
    assert [(f.path, f.change) for f in preview.files] == [("a.txt", "restored"), ("b.txt", "deleted")]
    assert (project / "b.txt").exists()  # a preview changes nothing

    (project / "b.txt").write_text("the person's")
    with pytest.raises(DaemonError) as refused:
        await daemon.rewind(s.id, 2)
    assert refused.value.status == 409 and refused.value.code == "rewind_conflict"
    assert "b.txt" in refused.value.message
    with pytest.raises(DaemonError) as bad:
        await daemon.rewind(s.id, 9)
    assert bad.value.status == 400 and bad.value.code == "bad_turn"
    with pytest.raises(DaemonError) as nothing:
        await daemon.rewind(s.id, 1, parts=[])
    assert nothing.value.status == 400

    after = (await daemon.session(s.id)).last_seq
    done = await daemon.rewind(s.id, 2, force=True)
    assert done.rewind_id and done.conflicts == ["b.txt"] and done.kernel["status"] == "restored"
    assert (project / "a.txt").read_text() == "one" and not (project / "b.txt").exists()
    events = await collect_until(daemon, s.id, after, Rewound)
    assert events[-1].turn == 2 and events[-1].files == done.files
    await turn(daemon, s.id, "run: print(n)")  # the namespace as it was before turn 2
    transcript = await daemon.transcript(s.id)
    last_tool = [r for r in transcript.records if isinstance(r, MessageRecord) and r.message.role == "tool"][-1]
    assert last_tool.message.content == "1"


async def collect_until(client: Client, sid: str, after: int, kind: type) -> list:
    out = []
    async for e in client.events(sid, after):
        out.append(e)
        if isinstance(e, kind):
            return out
    raise AssertionError("unreachable")


async def test_a_rewind_is_refused_while_a_turn_runs_over_the_api_and_the_cli(daemon: Client, project: Path,
                                                                              model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await turn(daemon, s.id, "run: print('first')")
    after = (await daemon.session(s.id)).last_seq
    accepted = await daemon.send(s.id, "run: import time\nprint('busy', flush=True)\ntime.sleep(60)")
    async for e in daemon.events(s.id, after):
        if e.type == "cell.output":
            break
    with pytest.raises(DaemonError) as running:
        await daemon.rewind(s.id, 1)
    assert running.value.status == 409 and running.value.code == "turn_running"
    cli = await asyncio.create_subprocess_exec(PRIME_AGENT, "rewind", s.id, "1", stdout=asyncio.subprocess.PIPE,
                                               stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 2 and b"a turn is running" in err, (out, err)
    await daemon.interrupt(s.id)
    await collect(daemon, s.id, accepted.turn_id, after)
    listed = await asyncio.create_subprocess_exec(PRIME_AGENT, "rewind", s.id, "--list",
                                                  stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(listed.communicate(), 60)
    assert listed.returncode == 0 and b"print('first')" in out, err
    done = await asyncio.create_subprocess_exec(PRIME_AGENT, "rewind", s.id, "2", "--conversation",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(done.communicate(), 60)
    assert done.returncode == 0 and b"rewound" in out and b"(conversation)" in out, err


FILES = 300


@pytest.mark.slow
def test_kill_9_during_a_rewind_leaves_the_old_state_or_the_new_never_a_mix(prime_home: Path, project: Path,
                                                                             model_server):
    client = SyncClient()
    try:
        s = client.create_session(project, model="fake", base_url=model_server.base_url)
        for text in ("one", "two"):
            accepted = client.send(s.id, f"run: import os\nfor i in range({FILES}):\n"
                                         f"    open(f'f{{i:03}}.txt', 'w').write('{text}' * 2000)")
            for e in client.events(s.id):
                if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
                    break
        intent = SessionLayout.of(s.id).rewind_intent
        pid = daemon_pid()
        rewind = subprocess.Popen([PRIME_AGENT, "rewind", s.id, "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not intent.exists() and rewind.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        killed_midway = intent.exists()
        os.kill(pid, signal.SIGKILL)
        rewind.wait(60)
        assert killed_midway, "the rewind ended before the daemon could be killed during it"

        client.close()
        client = SyncClient()  # starts the daemon again: it finishes the rewind before anything else
        info = client.session(s.id)
        assert not intent.exists()
        contents = {(project / f"f{i:03}.txt").read_text() for i in range(FILES)}
        assert contents == {"one" * 2000}
        records = read_records(SessionLayout.of(s.id).trajectory)
        rewinds = [r for r in records if isinstance(r, RewindRecord)]
        assert len(rewinds) == 1 and rewinds[0].turn == 2 and "kernel is new" in rewinds[0].kernel["why"]
        assert len([m for m in rewinds[0].messages if m.role == "user"]) == 1  # turn 1's conversation
        assert info.state == "dormant"
        accepted = client.send(s.id, "what now?")  # the model hears of the rewind, and of its new kernel
        for e in client.events(s.id):
            if e.type == "turn.finished" and e.turn_id == accepted.turn_id:
                break
        told = model_server.requests[-1]["messages"][-1]["content"]
        assert told.startswith("[The user rewound this session to before turn 2.") and "new kernel" in told
    finally:
        client.close()
        pid = daemon_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
