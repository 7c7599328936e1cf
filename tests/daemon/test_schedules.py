"""Schedules and heartbeats (daemon/schedules.py): a real daemon, real kernels, the fake model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from daemon.client import Client, DaemonError, SyncClient, daemon_pid
from daemon.schedules import Cron, Schedule, ScheduleStore, parse_duration
from tests.daemon.conftest import running_daemon
from tests.daemon.test_recovery import _wait_gone

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def model(request) -> Reply:
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content="slept")
    prompt = messages[-1]["content"]
    if "slow" in prompt:
        return Reply(code=["import time; time.sleep(2)"])
    return Reply(content="ok: " + prompt[-30:])


async def wait_for(predicate, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await predicate():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


def test_durations_and_cron_lines():
    assert [parse_duration(t) for t in ("2s", "5m", "1h30m", "1d", "90")] == [2, 300, 5400, 86400, 90]
    for bad in ("", "0s", "5x", "1h 30m", "-3"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    noon = time.mktime((2026, 12, 1, 11, 58, 30, 0, 0, -1))
    assert time.localtime(Cron("0 12 * * *").next_after(noon))[3:5] == (12, 0)
    assert time.localtime(Cron("*/15 * * * *").next_after(noon))[3:5] == (12, 0)
    assert time.localtime(Cron("30 9 * * 1-5").next_after(noon))[2:5] == (2, 9, 30)  # Wednesday
    assert time.localtime(Cron("0 0 29 2 *").next_after(noon))[:3] == (2028, 2, 29)
    for bad in ("* * * *", "61 * * * *", "a * * * *", "*/0 * * * *"):
        with pytest.raises(ValueError):
            Cron(bad)
    with pytest.raises(ValueError, match="never fires"):
        Cron("0 0 30 2 *").next_after(noon)


def test_an_every_schedule_stays_on_its_grid_however_late_it_fires():
    s = Schedule(id="s-1", prompt="tick", every=30.0, session="x", next_fire=1000.0)
    assert s.following(1000.2) == 1030.0  # a fire 0.2 s late does not push the next one back
    assert s.following(1095.0) == 1120.0  # three fell due while it was held: the next one on the grid
    noon = time.mktime((2026, 12, 1, 12, 0, 0, 0, 0, -1))
    cron = Schedule(id="s-2", prompt="tick", cron="0 * * * *", session="x", next_fire=noon)
    assert cron.following(noon + 0.4) == noon + 3600


async def test_every_with_a_count_fires_that_many_prompts_then_stops(daemon: Client, project: Path, prime_home: Path):
    with OpenAIServer(model) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        sched = await daemon.add_schedule(prompt="tick", every=0.7, count=3, session=s.id)
        assert sched.next_fire > time.time() and not sched.done

        async def done():
            (x,) = await daemon.schedules()
            info = await daemon.session(s.id)
            return x if x.done and info.turns == 3 and info.state == "idle" else None

        final = await wait_for(done)
        await asyncio.sleep(1.0)
        assert (await daemon.session(s.id)).turns == 3 and final.fired == 3 and final.next_fire is None
    fired = [json.loads(line) for line in (prime_home / "schedules.jsonl").read_text().splitlines()]
    assert [f["outcome"] for f in fired] == ["sent"] * 3
    events = [e async for e in _events(daemon, s.id)]
    assert [e.outcome for e in events if e.type == "schedule.fired"] == ["sent"] * 3


async def _events(client: Client, sid: str):
    last = (await client.session(sid)).last_seq
    async for e in client.events(sid, 0):
        yield e
        if e.seq >= last:
            return


async def test_a_fire_while_the_session_is_busy_queues_once(daemon: Client, project: Path):
    with OpenAIServer(model) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        await daemon.send(s.id, "slow one")
        sched = await daemon.add_schedule(prompt="check", every=0.2, session=s.id)
        queued = []

        async def skipped_twice():  # while the slow turn runs, fires fall every 0.2 s
            queued.append((await daemon.session(s.id)).queued)
            (x,) = await daemon.schedules()
            return x.skipped >= 2

        await wait_for(skipped_twice)
        await daemon.pause_schedule(sched.id)
        (x,) = await daemon.schedules()
        assert x.paused and x.fired >= 1 and max(queued) <= 1
        with pytest.raises(DaemonError) as e:
            await daemon.pause_schedule("s-nope")
        assert e.value.status == 404
        with pytest.raises(DaemonError) as e:
            await daemon.add_schedule(prompt="x", every=1, cron="* * * * *", session=s.id)
        assert e.value.status == 422 and "exactly one" in e.value.message
        for bad in ({"cron": "0 0 30 2 *", "session": s.id}, {"every": 1, "cwd": "rel/dir"},
                    {"every": 1, "cwd": "/tmp/\u0000x"}):
            with pytest.raises(DaemonError) as e:
                await daemon.add_schedule(prompt="x", **bad)
            assert e.value.status in (400, 422), e.value


async def test_a_heartbeat_wakes_a_dormant_session_which_sleeps_again(daemon: Client, project: Path):
    with OpenAIServer(model) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        await daemon.sleep(s.id)
        assert (await daemon.session(s.id)).state == "dormant"
        await daemon.add_schedule(every=0.3, count=1, session=s.id, heartbeat=True)

        async def slept_again():
            info = await daemon.session(s.id)
            return info.turns == 1 and info.state == "dormant"

        await wait_for(slept_again)
    transcript = await daemon.transcript(s.id)
    prompts = [r.prompt for r in transcript.records if r.kind == "turn_started"]
    assert len(prompts) == 1 and prompts[0].startswith("[Heartbeat]")


async def test_schedules_off_at_start_pause_everything_and_missed_fires_are_reported_not_replayed(
        prime_home: Path, project: Path):
    with OpenAIServer(model) as server:
        async with running_daemon() as client:
            s = await client.create_session(project, model="fake", base_url=server.base_url)
            sched = await client.add_schedule(prompt="tick", every=3600, session=s.id)
        store = ScheduleStore(prime_home)
        with store.edit() as st:  # as if the daemon had been down for 5 hours
            due = st.schedules[0].next_fire = time.time() - 5 * 3600 + 1800
        async with running_daemon(schedules=False) as client:
            (x,) = await client.schedules()
            assert x.paused and "schedules off" in x.paused_why and x.missed == 5
            assert x.next_fire == due + 5 * 3600  # the next one due on its grid, not a burst of the missed
            events = [e async for e in _events(client, s.id)]
            missed = [e for e in events if e.type == "schedule.fired"]
            assert [(e.outcome, e.missed) for e in missed] == [("missed", 5)]
            (resumed,) = await client.pause_schedule(sched.id, paused=False)
            assert not resumed.paused
            await asyncio.sleep(0.6)
            assert (await client.session(s.id)).turns == 0


@pytest.mark.slow
def test_cli_schedules_survive_kill_9_and_no_schedules_holds_them_until_resume(prime_home: Path, project: Path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PRIME_AGENT, *args], cwd=project, text=True, capture_output=True, timeout=60,
                              env={**os.environ, "OPENAI_BASE_URL": server.base_url, "PRIME_AGENT_MODEL": "fake"})

    with OpenAIServer(model) as server:
        client = SyncClient()
        try:
            added = cli("schedule", "add", "--every", "2s", "--count", "3", "hello")
            assert added.returncode == 0, added.stderr
            sid = added.stdout.split(":")[0]

            def fired() -> int:
                return next(s.fired for s in client.schedules() if s.id == sid)

            deadline = time.monotonic() + 30
            while fired() < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            pid = daemon_pid()
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
            offline = cli("schedule", "pause", "--all")
            assert offline.returncode == 0 and "not running" in offline.stderr
            start = cli("daemon", "start", "--no-schedules")
            assert start.returncode == 0, start.stderr
            (s,) = client.schedules()
            assert s.paused and s.fired == 1, (prime_home / "schedules.jsonl").read_text()[-600:]
            time.sleep(4.5)  # two fires would have fallen
            (s,) = client.schedules()
            assert s.fired == 1
            listed = cli("schedule", "list")
            assert "paused" in listed.stdout and "fired 1 of 3" in listed.stdout
            assert cli("schedule", "resume", sid).returncode == 0
            deadline = time.monotonic() + 30
            while fired() < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            (s,) = client.schedules()
            assert s.done and s.fired == 3
            deadline = time.monotonic() + 60  # fired is sent: the woken session runs the turns after
            while (info := client.session(s.session)).state != "idle" or info.queued or info.turns < 2:
                assert time.monotonic() < deadline, info
                time.sleep(0.1)
            assert info.turns in (2, 3)  # the fire at the kill may have been cut with its turn
        finally:
            client.close()  # the daemon it started is stopped by no_daemon_left_behind


async def test_fires_past_the_per_minute_cap_wait_and_a_deleted_sessions_schedule_pauses(prime_home: Path,
                                                                                          project: Path):
    with OpenAIServer(model) as server:
        async with running_daemon(max_fires_per_minute=2) as client:
            s = await client.create_session(project, model="fake", base_url=server.base_url)
            await client.add_schedule(prompt="tick", every=0.2, session=s.id)
            await asyncio.sleep(2.0)
            (x,) = await client.schedules()
            assert x.fired == 2  # the third waits for the minute to have room
            other = await client.create_session(project, model="fake", base_url=server.base_url)
            orphan = await client.add_schedule(prompt="tick", every=0.2, session=other.id)
            await client.delete(other.id)
            await asyncio.sleep(1.0)
            y = next(x for x in await client.schedules() if x.id == orphan.id)
            assert y.paused and y.paused_why == f"its session {other.id} was deleted"
