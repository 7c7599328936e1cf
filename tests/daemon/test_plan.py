"""Plan mode over the daemon's API: `mode: "plan"`, the plan in SessionInfo, POST .../plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kernel.sandbox import unavailable
from daemon.client import Client, DaemonError
from tests.daemon.conftest import collect

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
