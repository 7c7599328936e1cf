"""Faults from outside the daemon's own crash path: a model's malformed text, a full disk, a failed
save. None may wedge a session or lose what it recorded (issue 24)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent import events as ev
from agent.testing.openai_server import OpenAIServer, Reply
from tests.daemon.conftest import collect, running_daemon

HALF = "\ud83d"
"""Half an emoji: a lone UTF-16 surrogate, what a server that cuts a multi-byte character sends."""


def halves(request: dict[str, Any]) -> Reply:
    """Replies holding lone surrogates, in the text and in a tool call's code."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content="ran: " + messages[-1]["content"] + HALF)
    prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if m := re.search(r"run: (.*)", prompt, re.DOTALL):
        return Reply(code=[m.group(1) + f"  # {HALF}"])
    return Reply(content=f"half an emoji: {HALF}, then more")


async def test_a_reply_with_half_a_character_ends_its_turn_and_the_next_one_works(project: Path, prime_home: Path):
    with OpenAIServer(halves) as server:
        async with running_daemon() as client:
            s = await client.create_session(project, model="fake", base_url=server.base_url)
            for n, text in enumerate(["hello", "run: print('cell')", "and again"], 1):
                await client.send(s.id, text)
                finished = (await collect(client, s.id, f"t{n}"))[-1]
                assert finished.outcome == "completed", finished.error
            assert finished.answer == "half an emoji: \ufffd, then more"  # the half is replaced, said so
            events = await collect(client, s.id, "t3", after=0)
        async with running_daemon() as client:  # the journal is whole: a restart replays all of it
            replayed = [e async for e in _until(client, s.id, events[-1].seq)]
            await client.send(s.id, "after the restart")
            assert (await collect(client, s.id, "t4", after=events[-1].seq))[-1].outcome == "completed"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in events]
    cells = [e for e in events if isinstance(e, ev.CellFinished)]
    assert cells and cells[0].result.stdout == "cell\n"


async def test_a_failed_save_of_session_json_still_delivers_turn_finished(project: Path, prime_home: Path,
                                                                          model_server):
    async with running_daemon() as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        meta = prime_home / "sessions" / s.id / "session.json"
        await client.send(s.id, "run: import time; time.sleep(0.5); print('done')")
        seen = []
        async for e in client.events(s.id, s.last_seq):
            seen.append(e)
            if isinstance(e, ev.CellStarted):  # from here on session.json cannot be replaced: saves fail
                meta.unlink()
                meta.mkdir()
            if isinstance(e, ev.Error):
                break
        meta.rmdir()
    finished = [e for e in seen if isinstance(e, ev.TurnFinished)]
    assert finished and finished[0].answer == "ran: done"  # delivered live before the save was tried
    assert "could not save" in seen[-1].message and seen[-1].seq == finished[0].seq + 1


async def _until(client, session_id: str, last: int):
    async for e in client.events(session_id, 0):
        yield e
        if e.seq == last:
            return


# --- a full disk -------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MiB tmpfs (as root; skipped where mounting is not allowed)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
async def test_a_full_disk_ends_the_turn_with_an_error_and_the_session_recovers(project: Path, small_disk: Path,
                                                                                monkeypatch, model_server):
    home = small_disk / "home"
    home.mkdir()
    monkeypatch.setenv("PRIME_AGENT_HOME", str(home))
    filler = small_disk / "filler"
    async with running_daemon(pool_size=0) as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await client.send(s.id, "hello")
        assert (await collect(client, s.id, "t1"))[-1].outcome == "completed"
        # the disk fills up while a turn prints: the cell goes on printing once the test has filled it (on
        # a loaded machine its output, unpaced, had filled the disk before the test saw the cell start)
        accepted = await client.send(s.id, "run: print('x' * 2000, flush=True)\nimport os, time\n"
                                     "while not os.path.exists('filled'):\n    time.sleep(0.05)\n"
                                     "for i in range(200):\n    print('y' * 4000, flush=True)")
        seen = []
        async for e in client.events(s.id, s.last_seq):
            seen.append(e)
            if isinstance(e, ev.CellStarted):
                _fill(filler)
                (project / "filled").touch()
            if isinstance(e, ev.TurnFinished) and e.turn_id == accepted.turn_id:
                break
        finished = seen[-1]
        assert finished.outcome == "error" and "could not be written" in (finished.error or "")
        assert any(isinstance(e, ev.Error) and "No space left" in e.message for e in seen)
        assert (await client.session(s.id)).state == "idle"  # not "running" forever
        status = await client.status()
        assert status.write_error and "No space left" in status.write_error
        filler.unlink()  # space again: the session goes on
        await client.send(s.id, "still there?")
        done = [e async for e in _turn(client, s.id, "t3")]
        assert done[-1].outcome == "completed" and done[-1].answer == "echo: still there?"
    async with running_daemon(pool_size=0) as client:  # a restart wakes it, its record readable
        await client.send(s.id, "after a restart")
        done = [e async for e in _turn(client, s.id, "t4")]
        assert done[-1].outcome == "completed"
    lines = (home / "sessions" / s.id / "trajectory.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # no partial record glued to a whole one


def _fill(path: Path) -> None:
    """Take all the free space that is left."""
    free = shutil.disk_usage(path.parent).free
    with open(path, "wb") as f:
        try:
            f.write(b"\0" * free)
        except OSError:
            pass


async def _turn(client, session_id: str, turn_id: str):
    async for e in client.events(session_id, 0):
        if e.turn_id == turn_id:
            yield e
            if isinstance(e, ev.TurnFinished):
                return


async def test_a_damaged_line_inside_a_trajectory_is_skipped_and_reported_on_wake(project: Path, prime_home: Path,
                                                                                 model_server):
    """What a full disk left before records were written whole: a partial record glued to the next."""
    async with running_daemon() as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await client.send(s.id, "hello")
        await collect(client, s.id, "t1")
    path = prime_home / "sessions" / s.id / "trajectory.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, lines[2][:40] + lines[3])  # cut short, then a whole record after it on the same line
    path.write_text("\n".join(lines) + "\n")
    async with running_daemon() as client:
        await client.send(s.id, "again")
        events = await collect(client, s.id, "t2", after=(await client.session(s.id)).last_seq)
    assert events[-1].outcome == "completed" and events[-1].answer == "echo: again"
    (damaged,) = [e for e in events if isinstance(e, ev.Error)]
    assert "damaged line of the session's record was skipped" in damaged.message
    assert "trajectory.jsonl:3" in damaged.message
