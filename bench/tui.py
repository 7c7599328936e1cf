"""The app's attach: how long until a session's history is on screen.

    .venv/bin/python bench/tui.py [--events 2000] [--repeats 3]

Builds a session with at least `--events` events through a real daemon (in this process) and the
fake model server: turns that each run a cell and answer, streamed. Then opens the app headless
(Textual's run_test, 100x30) attached to it, and measures attach → every event applied and the
screen refreshed (beside the same for a session of one event: the app's own start); also how long
one live turn takes to show after the history, so "responsive" has a number. Prints a table and writes bench/results/tui.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save  # noqa: E402


async def build(client, project: Path, base_url: str, events: int) -> tuple[str, int]:
    s = await client.create_session(project, model="fake", base_url=base_url)
    n, seq = 0, 0
    while seq < events:
        n += 1
        turn = await client.send(s.id, f"run: for i in range(5): print('turn {n} line', i)")
        seq = (await client.wait_turn(s.id, turn.turn_id, after=seq)).seq
    return s.id, (await client.session(s.id)).last_seq


async def attach_once(client, project: Path, base_url: str, session_id: str, last_seq: int) -> dict[str, float]:
    from tui.app import NewSession, PrimeApp
    from tui.widgets.message import AssistantMessage

    app = PrimeApp(client, project, new=NewSession("fake", base_url), session_id=session_id)
    t0 = time.perf_counter()
    async with app.run_test(size=(100, 30)) as pilot:
        while app.events_seen < last_seq:
            await asyncio.sleep(0.005)
        await pilot.pause()  # the screen refreshed
        rendered = time.perf_counter() - t0
        widgets = len(app.query("Conversation > *"))
        # one live turn on top of the history
        t1 = time.perf_counter()
        app.query_one("#prompt").load_text("live one")
        await pilot.press("enter")
        while not any(m.text == "echo: live one" for m in app.query(AssistantMessage)):
            await asyncio.sleep(0.005)
        live = time.perf_counter() - t1
    return {"attach_rendered_s": rendered, "widgets": widgets, "live_turn_after_history_s": live}


async def main(args: argparse.Namespace) -> dict[str, float]:
    from agent.testing.openai_server import OpenAIServer
    from tests.daemon.conftest import agent_script, running_daemon

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        project = Path(tmp) / "project"
        project.mkdir()
        with OpenAIServer(agent_script) as server:
            async with running_daemon() as client:
                t = time.perf_counter()
                session_id, last_seq = await build(client, project, server.base_url, args.events)
                built = time.perf_counter() - t
                empty = await client.create_session(project, model="fake", base_url=server.base_url)
                baseline = await attach_once(client, project, server.base_url, empty.id, 1)
                runs = []
                for _ in range(args.repeats):  # each run's live turn adds a few events to the next one's history
                    seq = (await client.session(session_id)).last_seq
                    runs.append(await attach_once(client, project, server.base_url, session_id, seq))
    return {
        "events": float(last_seq),
        "build_s": built,
        "attach_rendered_p50_s": statistics.median(r["attach_rendered_s"] for r in runs),
        "attach_rendered_1_event_s": baseline["attach_rendered_s"],
        "attach_rendered_max_s": max(r["attach_rendered_s"] for r in runs),
        "widgets": float(runs[-1]["widgets"]),
        "live_turn_after_history_p50_s": statistics.median(r["live_turn_after_history_s"] for r in runs),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    load = load_average()
    figures = asyncio.run(main(args))
    for key, value in figures.items():
        print(f"{key:<32} {value:>10.3f}")
    save(ROOT / "bench" / "results" / "tui.json", figures, load)
