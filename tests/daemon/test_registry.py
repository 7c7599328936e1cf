"""The registry through the daemon's API: a session's title from its first prompt, closing it, and
the sessions an older `prime-agent run` left (real daemon, real kernels, the fake model server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from daemon.client import Client, DaemonError
from daemon.meta import TITLE_LENGTH
from daemon.meta import load as load_meta
from daemon.registry import Hosted
from tests.conftest import make_config
from tests.daemon.conftest import collect, running_daemon


async def test_a_session_is_titled_by_its_first_prompt(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    assert s.title is None
    long = "  Fix the flaky test in   tests/test_io.py " + "and then explain why it was flaky " * 5
    await daemon.send(s.id, "\n\n" + long + "\nsecond line, not in the title")
    await collect(daemon, s.id, "t1")
    await daemon.send(s.id, "a later prompt does not rename it")
    await collect(daemon, s.id, "t2")
    title = (await daemon.session(s.id)).title
    assert title is not None and title.startswith("Fix the flaky test in tests/test_io.py and then")
    assert len(title) == TITLE_LENGTH and title.endswith("…") and "\n" not in title
    named = await daemon.create_session(project, model="fake", base_url=model_server.base_url, title="mine")
    await daemon.send(named.id, "something else")
    await collect(daemon, named.id, "t1")
    assert (await daemon.session(named.id)).title == "mine"


async def test_closing_stops_the_running_turn_and_kernel_and_a_prompt_opens_it_again(
        daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: import time; time.sleep(60)")
    queued = await daemon.send(s.id, "never runs")
    while (await daemon.session(s.id)).state != "running":
        await asyncio.sleep(0.05)
    with pytest.raises(DaemonError) as busy:
        await daemon.close_session(s.id, if_idle=True)
    assert busy.value.status == 409 and "busy" in busy.value.message
    closed = await daemon.close_session(s.id)
    assert closed.state == "closed"
    events = await collect(daemon, s.id, "t1", after=0)  # the queued t2 is dropped first
    ends = {e.turn_id: e for e in events if e.type == "turn.finished"}
    assert ends["t1"].outcome == "interrupted"
    assert (ends["t2"].outcome, ends["t2"].error) == ("interrupted", "the session was closed")
    assert [x.state for x in await daemon.sessions()] == ["closed"]
    reopened = await daemon.send(s.id, "hello again")
    done = await collect(daemon, s.id, reopened.turn_id)
    assert done[-1].outcome == "completed" and done[-1].answer == "echo: hello again"
    assert (await daemon.session(s.id)).state == "idle"


async def test_a_closed_session_stays_closed_across_a_restart(project: Path, model_server):
    async with running_daemon() as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await client.send(s.id, "hi")
        await collect(client, s.id, "t1")
        await client.close_session(s.id)
    async with running_daemon() as client:
        info = await client.session(s.id)
        assert (info.state, info.turns, info.title) == ("closed", 1, "hi")


async def test_a_session_an_older_run_left_is_listed_and_rewound(project: Path):
    model = ScriptedModel([cells("open('a.txt', 'w').write('one')"), "wrote it"])
    async with Session(make_config(), model, cwd=project) as session:  # as `run` hosted it before the registry
        await session.prompt("write one to a.txt\nplease")
    assert not session.layout.meta.exists() and (project / "a.txt").exists()
    async with running_daemon() as client:
        (info,) = await client.sessions()
        assert (info.id, info.state, info.turns, info.title, info.cwd, info.model) == (
            session.id, "closed", 1, "write one to a.txt", str(project), "scripted")
        done = await client.rewind(session.id, 1, parts=["code"])
        assert [(f.change, f.path) for f in done.files] == [("deleted", "a.txt")]
        assert not (project / "a.txt").exists()


async def test_taking_up_a_closed_run_session_keeps_when_it_was_last_used(project: Path, model_server):
    """Issue 52: `prime-agent -c` (the session last used here) opened an older closed `run` session,
    because the daemon that took it up rewrote its `updated`."""
    config = make_config(model={"name": "scripted"})
    session = Session(config, ScriptedModel(["done"]), cwd=project)  # as `prime-agent run` hosts it
    hosted = Hosted.register(session.id, session.layout, project, config, {}, "an older task")
    session.listeners.insert(0, hosted.on_event)
    await session.start()
    await session.prompt("an older task")
    await session.close()
    hosted.close()
    ran = load_meta(session.layout).updated
    assert ran > 0
    async with running_daemon() as client:
        newer = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await collect(client, newer.id, (await client.send(newer.id, "a newer prompt")).turn_id)
        listed = {s.id: s for s in await client.sessions()}  # the run's session taken up, if not at start
        assert listed[session.id].updated == ran
        assert max(listed.values(), key=lambda s: s.updated).id == newer.id
    async with running_daemon() as client:  # a restart takes every session up again
        listed = {s.id: s for s in await client.sessions()}
        assert listed[session.id].updated == ran
        assert max(listed.values(), key=lambda s: s.updated).id == newer.id
