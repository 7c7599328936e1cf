"""Limits and backpressure: many sessions at once, queued turns, a reader that falls behind."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from daemon.client import Client, DaemonError
from daemon.manager import SessionManager
from daemon.schemas import CreateSession
from tests.conftest import make_config
from tests.daemon.conftest import collect, running_daemon


@pytest.mark.slow
async def test_twenty_sessions_at_once_all_complete_with_no_event_lost(project: Path, model_server, prime_home: Path):
    async with running_daemon(pool_size=2, max_running_turns=8) as client:
        sessions = await asyncio.gather(*(client.create_session(project, model="fake", base_url=model_server.base_url)
                                          for _ in range(20)))

        async def drive(s: dict) -> list:
            await client.send(s.id, f"run: print('{s.id}')")
            await client.send(s.id, "and again")  # queued behind the first
            return await collect(client, s.id, "t2")

        results = await asyncio.gather(*(drive(s) for s in sessions))
        for s, events in zip(sessions, results):
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            finished = [e for e in events if e.type == "turn.finished"]
            assert [(e.turn_id, e.outcome) for e in finished] == [("t1", "completed"), ("t2", "completed")]
            assert finished[0].answer == f"ran: {s.id}"
        status = await client.status()
        assert (status.sessions, status.live_sessions, status.running_turns) == (20, 20, 0)


async def test_past_max_sessions_the_longest_idle_one_sleeps_and_busy_ones_are_never_touched(
        project: Path, model_server, prime_home: Path):
    async with running_daemon(max_sessions=2, max_running_turns=1) as client:
        a, b = [await client.create_session(project, model="fake", base_url=model_server.base_url) for _ in range(2)]
        await client.send(a.id, "run: x = 1")
        await collect(client, a.id, "t1")
        c = await client.create_session(project, model="fake", base_url=model_server.base_url)
        states = {s.id: s.state for s in await client.sessions()}
        assert states == {a.id: "idle", b.id: "dormant", c.id: "idle"}  # b was used least recently
        # a wakes b's way back: a new kernel, and the model is told why
        await client.send(b.id, "hello again")
        events = await collect(client, b.id, "t1")
        assert any(e.type == "session.resumed" and "idle" in e.reason for e in events)
        assert "kernel was stopped to free memory" in model_server.requests[-1]["messages"][-1]["content"]
        # busy sessions (a turn running, or someone following the events) are never put to sleep
        await client.send(a.id, "run: import time; time.sleep(1.5)")
        follow = client.events(b.id)
        await anext(follow)
        with pytest.raises(DaemonError) as e:
            await client.create_session(project, model="fake", base_url=model_server.base_url)
        assert e.value.status == 429 and "max_sessions" in e.value.message
        second = await client.send(b.id, "waits for the turn slot")  # max_running_turns=1: a runs
        assert second.queued is True
        await follow.aclose()


async def test_an_idle_session_sleeps_after_the_idle_timeout(project: Path, model_server, prime_home: Path):
    async with running_daemon(idle_timeout=0.3) as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        for _ in range(100):
            if (await client.session(s.id)).state == "dormant":
                break
            await asyncio.sleep(0.1)
        assert (await client.session(s.id)).state == "dormant"
        assert (await client.status()).live_sessions == 0
        await client.send(s.id, "still here?")
        assert (await collect(client, s.id, "t1"))[-1].answer == "echo: still here?"


async def test_a_reader_that_falls_behind_is_dropped_and_never_stalls_the_session(project: Path, model_server,
                                                                                   prime_home: Path):
    manager = SessionManager(make_config(daemon={"pool_size": 0, "client_buffer": 32}), prime_home)
    await manager.start()
    try:
        managed = await manager.create(CreateSession(cwd=str(project), model="fake", base_url=model_server.base_url))
        replay, stalled = managed.subscribe(0)  # and never read from
        assert [seq for seq, _ in replay] == [1]
        managed.send("run: import time\nfor i in range(100):\n    print(i, flush=True)\n    time.sleep(0.01)", "prompt")
        _, reader = managed.subscribe(managed.journal.last_seq)
        while True:
            item = await asyncio.wait_for(reader.queue.get(), 60)
            if '"turn.finished"' in item[1]:
                break
        assert stalled.dropped and stalled not in managed.fanout.subscribers
        assert (await stalled.queue.get()) is None  # its stream ends; it may reconnect from its last id
        assert not reader.dropped
    finally:
        await manager.stop(5)


async def test_stopping_interrupts_running_turns_and_records_them(project: Path, model_server, prime_home: Path):
    async with running_daemon() as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await client.send(s.id, "run: import time; print('long', flush=True); time.sleep(60)")
        await client.send(s.id, "queued")
        async for e in client.events(s.id):
            if e.type == "cell.output":
                break
    # the daemon drained on the way out: the running turn interrupted, the queued one dropped, both recorded
    async with running_daemon() as client:
        events = [e async for e in _until_seq(client, s.id)]
        finished = {e.turn_id: e for e in events if e.type == "turn.finished"}
        assert finished["t1"].outcome == "interrupted" and finished["t2"].outcome == "interrupted"
        assert "stopped" in finished["t2"].error
        assert [e.type for e in events].count("turn.finished") == 2
        assert (await client.session(s.id)).state == "dormant"


async def _until_seq(client: Client, session_id: str):
    last = (await client.session(session_id)).last_seq
    async for e in client.events(session_id):
        yield e
        if e.seq == last:
            return


async def test_prompts_sent_while_a_dormant_session_wakes_keep_one_numbering(project: Path, model_server,
                                                                             prime_home: Path):
    async with running_daemon() as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
    async with running_daemon() as client:  # dormant now; three prompts race its waking
        turns = [(await client.send(s.id, text)).turn_id for text in ("a", "b", "c")]
        events = await collect(client, s.id, "t3")
        assert turns == ["t1", "t2", "t3"]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.answer for e in events if e.type == "turn.finished"] == ["echo: a", "echo: b", "echo: c"]
        assert [e.type for e in events].count("session.resumed") == 1


async def test_concurrent_creates_respect_max_sessions(project: Path, model_server, prime_home: Path):
    async with running_daemon(max_sessions=2) as client:
        results = await asyncio.gather(
            *(client.create_session(project, model="fake", base_url=model_server.base_url) for _ in range(5)),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(r, DaemonError) and r.status == 429 for r in refused)  # others were still starting
        assert len(refused) <= 3 and (await client.status()).live_sessions == 2


async def test_a_stopping_daemon_never_starts_a_turn_that_waits_for_a_slot(project: Path, model_server,
                                                                            prime_home: Path):
    async with running_daemon(max_running_turns=1) as client:
        a = await client.create_session(project, model="fake", base_url=model_server.base_url)
        b = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await client.send(a.id, "run: import time; print('busy', flush=True); time.sleep(60)")
        async for e in client.events(a.id):
            if e.type == "cell.output":
                break
        assert (await client.send(b.id, "waiting")).queued is True
        asked = len(model_server.requests)
    assert len(model_server.requests) == asked  # b's turn never reached the model
    async with running_daemon() as client:
        (finished,) = [e async for e in _until_seq(client, b.id) if e.type == "turn.finished"]
        assert finished.outcome == "interrupted" and "stopped before this turn began" in finished.error


async def test_deleting_a_session_mid_turn_records_the_turn_as_interrupted(project: Path, model_server,
                                                                           prime_home: Path):
    async with running_daemon() as client:
        s = await client.create_session(project, model="fake", base_url=model_server.base_url)
        await client.send(s.id, "run: import time; print('busy', flush=True); time.sleep(60)")
        async for e in client.events(s.id):
            if e.type == "cell.output":
                break
        await client.delete(s.id)
    lines = (prime_home / "sessions" / s.id / "events.jsonl").read_text().splitlines()
    finished = [json.loads(x) for x in lines if '"turn.finished"' in x]
    assert [(f["turn_id"], f["outcome"]) for f in finished] == [("t1", "interrupted")]
    assert finished[0]["error"]


async def test_an_interrupt_can_name_the_queued_turn_it_drops(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: import time; time.sleep(1)")
    mine = await daemon.send(s.id, "mine")
    assert (await daemon.interrupt(s.id, turn_id=mine.turn_id)).model_dump() == {"turn_id": None, "dropped": ["t2"]}
    with pytest.raises(DaemonError) as e:
        await daemon.interrupt(s.id, turn_id="t9")
    assert e.value.status == 409
    events = await collect(daemon, s.id, "t1")
    assert {e.turn_id: e.outcome for e in events if e.type == "turn.finished"} == {
        "t2": "interrupted", "t1": "completed"}


async def test_steering_too_late_for_its_turn_becomes_the_next_prompt(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    await daemon.send(s.id, "run: import time; print('go', flush=True); time.sleep(0.5); final('done')")
    async for e in daemon.events(s.id):
        if e.type == "cell.output":
            break
    assert (await daemon.send(s.id, "one more thing", mode="steer")).turn_id == "t1"
    events = await collect(daemon, s.id, "t2")  # t1 ended by final() before a model call could see it
    answers = {e.turn_id: e.answer for e in events if e.type == "turn.finished"}
    assert answers == {"t1": "done", "t2": "echo: one more thing"}
