"""Goals and schedules benchmark: prints a table and writes bench/results/goals.json.

    .venv/bin/python bench/goals.py [--checks 40] [--continuations 20] [--fires 20] [--every 0.5]

Measures:

- a goal's check (`true`) run as goals run it, in a sandbox of its own that is the session kernel's
  (`Session.check`: a box, its view mounted, a process tree), next to a plain host subprocess of the
  same command, interleaved; and with `--sandbox full-access` (the box without bubblewrap);
- what a continuation adds between two turns of a goal: from one turn's `turn.finished` to the next
  one's `turn.started` (the check, its events and records, the continuation prompt), in a session
  with a scripted model whose every turn is one answer and whose check never passes;
- how late a daemon's schedule fires: `--every` seconds for `--fires` fires into an idle session of
  a daemon served in this process, each fire's `schedule.fired` event against its time on the
  schedule's grid; and the drift, the last fire's lateness less the first's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import events as ev  # noqa: E402
from agent.config_models import Config  # noqa: E402
from agent.goals import GoalBudget, GoalSpec, GoalState  # noqa: E402
from agent.kernel.sandbox import unavailable  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.openai_server import OpenAIServer, Reply  # noqa: E402
from agent.testing.scripted import ScriptedModel  # noqa: E402
from bench.kernel import pct  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from daemon.client import Client  # noqa: E402
from daemon.server import serve  # noqa: E402


async def host_true() -> float:
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_shell("true", stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.STDOUT)
    await proc.communicate()
    return time.perf_counter() - t


async def checks(n: int, cwd: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"sandboxed": [], "full_access": [], "host": []}
    boxed = Session(Config(), ScriptedModel([]), cwd=cwd)
    bare = Session(Config.model_validate({"sandbox": {"mode": "full-access"}}), ScriptedModel([]), cwd=cwd)
    async with boxed, bare:
        for _ in range(3):  # warm: the first box pays for imports
            await boxed.check("true", 30)
            await bare.check("true", 30)
        for _ in range(n):  # interleaved: the machine's speed drifts
            for name, session in (("sandboxed", boxed), ("full_access", bare)):
                t = time.perf_counter()
                result = await session.check("true", 30)
                assert result.passed, result
                out[name].append(time.perf_counter() - t)
            out["host"].append(await host_true())
    return out


async def continuations(n: int, cwd: Path) -> list[float]:
    events: list[ev.Event] = []
    model = ScriptedModel([f"not done yet ({i})" for i in range(n + 1)])
    async with Session(Config(), model, cwd=cwd, on_event=events.append) as session:
        goal = await session.pursue(GoalState.new(GoalSpec(text="make the file done", check="test -f done",
                                                           budget=GoalBudget(max_continuations=n))))
    assert goal.state == "exhausted" and goal.continuations == n, goal
    finished = {e.turn_id: e.ts for e in events if isinstance(e, ev.TurnFinished)}
    started = [e for e in events if isinstance(e, ev.TurnStarted)]
    return [b.ts - finished[a.turn_id] for a, b in zip(started, started[1:])]


async def fires(n: int, every: float, cwd: Path) -> list[float]:
    stop, ready = asyncio.Event(), asyncio.Event()
    config = Config.model_validate({"daemon": {"pool_size": 1}})
    task = asyncio.create_task(serve(None, config, stop, lambda info: ready.set(), handle_signals=False))
    await ready.wait()
    client = Client()
    try:
        with OpenAIServer(lambda request: Reply(content="ok")) as server:
            s = await client.create_session(cwd, model="fake", base_url=server.base_url)
            sched = await client.add_schedule(prompt="tick", every=every, count=n, session=s.id)
            grid = sched.next_fire
            late, last = [], None
            async for e in client.events(s.id, 0):
                if e.type == "schedule.fired":
                    late.append(e.ts - (grid + len(late) * every))
                    last = e.turn_id if len(late) == n else None
                elif e.type == "turn.finished" and e.turn_id == last:
                    break  # the last fire's turn is over: nothing is cut when the daemon stops
    finally:
        await client.close()
        stop.set()
        await task
    return late


def ms(xs: list[float], q: float) -> float:
    return pct(xs, q) * 1e3


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checks", type=int, default=40)
    p.add_argument("--continuations", type=int, default=20)
    p.add_argument("--fires", type=int, default=20)
    p.add_argument("--every", type=float, default=0.5)
    a = p.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        cwd = Path(tmp) / "project"
        cwd.mkdir()
        check = await checks(a.checks, cwd)
        gaps = await continuations(a.continuations, cwd)
        late = await fires(a.fires, a.every, cwd)
    figures = {
        **{f"check_{k}_p50_ms": ms(v, 0.5) for k, v in check.items()},
        **{f"check_{k}_p90_ms": ms(v, 0.9) for k, v in check.items()},
        "continuation_gap_p50_ms": ms(gaps, 0.5), "continuation_gap_p90_ms": ms(gaps, 0.9),
        "fire_late_p50_ms": ms(late, 0.5), "fire_late_max_ms": max(late) * 1e3,
        "fire_drift_ms": (late[-1] - late[0]) * 1e3,
    }
    rows = [
        ("check `true`, sandboxed as the kernel (p50 / p90)", "check_sandboxed"),
        ("check `true`, full-access box (p50 / p90)", "check_full_access"),
        ("plain host subprocess `true` (p50 / p90)", "check_host"),
        ("turn end to next turn start in a goal (p50 / p90)", "continuation_gap"),
    ]
    print(f"sandbox: {unavailable() or 'bubblewrap'}; {a.checks} checks, {a.continuations} continuations, "
          f"{a.fires} fires every {a.every:g}s")
    print(f"{'measure':<52} {'ms':>17}")
    for label, key in rows:
        print(f"{label:<52} {figures[key + '_p50_ms']:>8.1f} {figures[key + '_p90_ms']:>8.1f}")
    print(f"{'schedule fire lateness (p50 / max)':<52} {figures['fire_late_p50_ms']:>8.1f} "
          f"{figures['fire_late_max_ms']:>8.1f}")
    print(f"{'schedule drift over the fires (last - first)':<52} {figures['fire_drift_ms']:>8.1f}")
    save(ROOT / "bench" / "results" / "goals.json", {**vars(a), "sandbox": unavailable() or "bubblewrap", **figures}, load)


if __name__ == "__main__":
    asyncio.run(main())
