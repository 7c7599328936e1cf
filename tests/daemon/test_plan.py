"""Plan mode over the daemon's API: `mode: "plan"`, the plan in SessionInfo, POST .../plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.kernel.sandbox import unavailable
from daemon.client import Client, DaemonError
from tests.daemon.conftest import collect, running_daemon

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"no sandbox here: {unavailable()}")


async def test_a_plan_approved_over_the_api_is_carried_out_by_the_same_kernel(daemon: Client, project: Path,
                                                                             model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, mode="plan")
    assert s.planning
    plan = "run: open('x.txt', 'w').write(str(v))"
    accepted = await daemon.send(s.id, "run: v = 7\ntry:\n    open('x.txt', 'w')\nexcept OSError:\n    print('read-only')\n"
                                       f"propose_plan({plan!r})")
    events = await collect(daemon, s.id, accepted.turn_id)
    assert any(e.type == "plan.proposed" for e in events) and events[-1].answer == plan
    info = await daemon.session(s.id)
    assert info.planning and info.plan == plan and not (project / "x.txt").exists()
    with pytest.raises(DaemonError) as e:  # nothing to carry out without a decision
        await daemon.decide_plan("no-such-session", True)
    assert e.value.status == 404
    decided = await daemon.decide_plan(s.id, True, note="go ahead")
    events = await collect(daemon, s.id, decided.turn_id or "", after=events[-1].seq)
    assert any(e.type == "plan.decided" and e.approved for e in events)
    assert (project / "x.txt").read_text() == "7"  # the same kernel's `v`
    info = await daemon.session(s.id)
    assert not info.planning and info.plan is None
    with pytest.raises(DaemonError) as e:
        await daemon.decide_plan(s.id, True)
    assert e.value.status == 409 and "no plan waits" in e.value.message


async def test_a_plan_decided_as_soon_as_it_is_shown_waits_for_its_turn_to_end(daemon: Client, project: Path,
                                                                             model_server):
    """The card is up from `plan.proposed`, while the turn that proposed it may still be ending (here
    the rest of its cell takes a second): a person who answers at once is heard, not told that a turn
    is running (the app's card then stayed "waiting": a CI failure of test_plan_mode_shows...)."""
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, mode="plan")
    accepted = await daemon.send(s.id, "run: propose_plan('look first')\nimport time; time.sleep(1)")
    async for e in daemon.events(s.id):
        if e.type == "plan.proposed":
            break
    assert (await daemon.session(s.id)).state == "running"
    decided = await daemon.decide_plan(s.id, False, note="not yet")
    assert not decided.approved
    events = await collect(daemon, s.id, accepted.turn_id)
    assert events[-1].outcome == "completed"
    info = await daemon.session(s.id)
    assert info.planning and info.plan is None


async def _propose(daemon: Client, session_id: str, plan: str) -> list:
    accepted = await daemon.send(session_id, f"run: propose_plan({plan!r})")
    return await collect(daemon, session_id, accepted.turn_id)


WRITE = "run: open('w.txt', 'w').write('w')\nprint('wrote')"


async def test_an_approval_survives_a_daemon_that_died_before_saving_session_json(prime_home: Path, project: Path,
                                                                                  model_server):
    """The approval's record is its one durable fact: session.json as a daemon killed right after the
    record (before any save) left it still says plan mode, and the session wakes writable."""
    async with running_daemon() as daemon:
        s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, mode="plan")
        await _propose(daemon, s.id, "write w.txt")
        await daemon.decide_plan(s.id, True)
        await daemon.interrupt(s.id, drop_queued=True)  # its follow-up turn never ran, as after a crash
    meta = Path(s.dir) / "session.json"
    saved = json.loads(meta.read_text())
    saved["overrides"].setdefault("sandbox", {})["plan"] = True  # what it said before approval's save, if any
    meta.write_text(json.dumps(saved))
    async with running_daemon() as daemon:
        info = await daemon.session(s.id)
        assert not info.planning and info.plan is None  # dormant: the trajectory says so
        accepted = await daemon.send(s.id, WRITE)
        events = await collect(daemon, s.id, accepted.turn_id)
        assert events[-1].answer == "ran: wrote" and (project / "w.txt").read_text() == "w"
        assert not (await daemon.session(s.id)).planning


async def test_another_sandbox_mode_takes_a_session_out_of_plan_mode_and_it_still_starts(daemon: Client, project: Path,
                                                                                           model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, mode="plan")
    events = await _propose(daemon, s.id, "write w.txt")
    assert (await daemon.session(s.id)).plan == "write w.txt"
    info = await daemon.update(s.id, sandbox="full-access")
    assert not info.planning and info.plan is None  # the plan that waited is dropped, said so
    with pytest.raises(DaemonError) as e:
        await daemon.decide_plan(s.id, True)
    assert e.value.status == 409
    accepted = await daemon.send(s.id, WRITE)
    events = await collect(daemon, s.id, accepted.turn_id, after=events[-1].seq)
    assert any(e.type == "note" and "plan mode off" in e.text for e in events)
    assert events[-1].answer == "ran: wrote" and (project / "w.txt").exists()
    info = await daemon.session(s.id)
    assert info.sandbox.startswith("full-access") and not info.planning
    with pytest.raises(DaemonError) as e:  # plan mode exists only in workspace-write
        await daemon.update(s.id, sandbox="read-only", plan=True)
    assert e.value.status == 400 and "workspace-write" in e.value.message


async def test_plan_mode_turned_on_between_turns_and_off_again(daemon: Client, project: Path, model_server):
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url, sandbox="full-access")
    assert not s.planning
    info = await daemon.update(s.id, plan=True)  # from full-access: plan mode is in workspace-write
    assert info.planning
    accepted = await daemon.send(s.id, WRITE.replace("print('wrote')", "") + "\nprint('wrote')")
    events = await collect(daemon, s.id, accepted.turn_id)
    assert "OSError" in events[-1].answer or "Read-only" in events[-1].answer
    assert not (project / "w.txt").exists()
    info = await daemon.session(s.id)
    assert info.planning and info.sandbox.startswith("workspace-write")
    info = await daemon.update(s.id, plan=False)
    assert not info.planning
    accepted = await daemon.send(s.id, WRITE)
    events = await collect(daemon, s.id, accepted.turn_id, after=events[-1].seq)
    assert events[-1].answer == "ran: wrote" and (project / "w.txt").exists()
