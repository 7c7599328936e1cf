"""ACP benchmark: prints a table and writes bench/results/acp.json.

    .venv/bin/python bench/acp.py [--rounds 8] [--cells 8]

The same turns through `prime-agent acp` (the official SDK's client, `spawn_agent_process`, as an
editor drives it) and through the daemon's HTTP API (daemon/client.py over the Unix socket, an event
stream open), round after round in one run, alternating which goes first. Both are sessions of one
daemon (`python -m daemon` as `daemon.client.spawn` starts it, pool of 2), with real kernels and the
fake OpenAI server as the model; the ACP agent is itself a client of that daemon, so what ACP adds is
its process's relaying: events to `session/update`s, JSON-RPC on stdio. Measures:

- prompt to first update: `session/prompt` sent until the first `agent_message_chunk` arrives,
  against `POST .../messages` until the turn's first `model.delta` arrives on the stream (the same
  text); beside it the HTTP stream's first event (`turn.started`, which ACP does not forward);
- prompt to the end of an answer-only turn (the prompt's response; `turn.finished`);
- per-cell cost: a turn of `--cells` cells (one a model call) against a turn of one, over ACP and
  over HTTP: (T_N - T_1) / (N - 1), and the difference, ACP's overhead per cell;
- the baseline: a GET /v1/status round trip (this machine's speed varies ~2x over a day).

The load average is printed before and after, and kept in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # not bench/: this file's name would hide the `acp` package

import acp  # noqa: E402
from acp import schema as s  # noqa: E402

from agent.testing.openai_server import OpenAIServer, Reply  # noqa: E402
from bench.daemon import Daemon, Follower, in_a_home, status_round_trip  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from bench.kernel import pct, print_table  # noqa: E402
from daemon.client import Client  # noqa: E402

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def script(request: dict[str, Any]) -> Reply:
    """The fake model: `cells: N` runs N cells, one a model call, then answers; else an echo."""
    messages = request["messages"]
    user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    if m := re.search(r"cells: (\d+)", messages[user]["content"]):
        done = sum(1 for msg in messages[user:] if msg["role"] == "tool")
        return Reply(code=[f"x = {done}"]) if done < int(m.group(1)) else Reply(content=f"ran {done} cells")
    return Reply(content="echo: " + messages[user]["content"][-40:])


class Editor:
    """The ACP client side: each update with its arrival time; permissions are not asked here."""

    def __init__(self) -> None:
        self.updates: list[tuple[float, Any]] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((time.perf_counter(), update))

    async def request_permission(self, options, session_id, tool_call, **kwargs) -> s.RequestPermissionResponse:
        return s.RequestPermissionResponse(outcome=s.DeniedOutcome(outcome="cancelled"))

    def on_connect(self, conn) -> None:
        pass


async def acp_turn(conn, editor: Editor, session_id: str, prompt: str) -> tuple[float, float | None]:
    """Seconds to the first agent_message_chunk (None if none came) and to the prompt's response."""
    editor.updates.clear()
    t = time.perf_counter()
    reply = await conn.prompt(session_id=session_id, prompt=[acp.text_block(prompt)])
    end = time.perf_counter() - t
    assert reply.stop_reason == "end_turn", reply
    first = next((at - t for at, u in editor.updates if isinstance(u, s.AgentMessageChunk)), None)
    return end, first


async def http_turn(client: Client, follower: Follower, session_id: str, prompt: str) -> tuple[float, float, float]:
    """Seconds to the turn's first event, its first model.delta, and its turn.finished."""
    t = time.perf_counter()
    turn = await client.send(session_id, prompt)
    first_event = first_text = None
    while True:
        at, e = await asyncio.wait_for(follower.arrivals.get(), 120)
        if e.turn_id != turn.turn_id:
            continue
        first_event = first_event or at - t
        if e.type == "model.delta" and first_text is None:
            first_text = at - t
        if e.type == "turn.finished":
            assert e.outcome == "completed", e
            return first_event, first_text or at - t, at - t


async def run(args: argparse.Namespace, root: Path) -> dict[str, float]:
    project = root / "project"
    project.mkdir()
    samples: dict[str, list[float]] = {k: [] for k in (
        "acp_first", "http_first_event", "http_first_text", "acp_answer", "http_answer",
        "acp_cell_1", "acp_cell_n", "http_cell_1", "http_cell_n")}
    with OpenAIServer(script) as server:
        async with Daemon(root / "home", pool_size=2) as client:
            rt = await status_round_trip(client, 200)
            editor = Editor()
            # auto-refine off on both sides: its review call every 25 turns is not what is measured
            argv = (PRIME_AGENT, "acp", "--model", "fake", "--base-url", server.base_url, "--set", "refine.auto_every=0")
            async with acp.spawn_agent_process(editor, *argv, env=dict(os.environ)) as (conn, process):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=s.ClientCapabilities(),
                                      client_info=s.Implementation(name="bench", version="1"))
                acp_session = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
                http_session = (await client.create_session(project, model="fake", base_url=server.base_url,
                                                            config={"refine": {"auto_every": 0}})).id
                follower = Follower(client, http_session, (await client.session(http_session)).last_seq)
                try:
                    for side in ("acp", "http"):  # warm up: kernels started, model clients connected
                        for prompt in ("warm up", "cells: 2"):
                            if side == "acp":
                                await acp_turn(conn, editor, acp_session, prompt)
                            else:
                                await http_turn(client, follower, http_session, prompt)
                    for r in range(args.rounds):
                        for side in (("acp", "http") if r % 2 == 0 else ("http", "acp")):
                            if side == "acp":
                                end, first = await acp_turn(conn, editor, acp_session, f"hello {r}")
                                assert first is not None, "no agent_message_chunk"
                                samples["acp_first"].append(first)
                                samples["acp_answer"].append(end)
                                samples["acp_cell_1"].append((await acp_turn(conn, editor, acp_session, "cells: 1"))[0])
                                samples["acp_cell_n"].append(
                                    (await acp_turn(conn, editor, acp_session, f"cells: {args.cells}"))[0])
                            else:
                                event, text, end = await http_turn(client, follower, http_session, f"hello {r}")
                                samples["http_first_event"].append(event)
                                samples["http_first_text"].append(text)
                                samples["http_answer"].append(end)
                                samples["http_cell_1"].append(
                                    (await http_turn(client, follower, http_session, "cells: 1"))[2])
                                samples["http_cell_n"].append(
                                    (await http_turn(client, follower, http_session, f"cells: {args.cells}"))[2])
                finally:
                    await follower.close()
                assert process.stdin is not None
                process.stdin.close()  # the editor goes: the agent puts its session to sleep and exits
                await asyncio.wait_for(process.wait(), 60)
        requests = len(server.requests)
    # warm-up: 1 + 3 requests a side; a round: 1 (answer) + 2 (one cell) + N + 1 (N cells) a side
    expected = 2 * 4 + 2 * args.rounds * (args.cells + 4)
    assert requests == expected, f"the model served {requests} requests, not the {expected} these turns make"

    ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    per_cell = {side: (ms[f"{side}_cell_n"] - ms[f"{side}_cell_1"]) / (args.cells - 1) for side in ("acp", "http")}
    return {
        "status_p50_ms": statistics.median(rt) * 1e3,
        "first_update_acp_p50_ms": ms["acp_first"],
        "first_update_acp_p90_ms": pct(samples["acp_first"], 0.9) * 1e3,
        "first_text_http_p50_ms": ms["http_first_text"],
        "first_text_http_p90_ms": pct(samples["http_first_text"], 0.9) * 1e3,
        "first_event_http_p50_ms": ms["http_first_event"],
        "first_update_overhead_ms": ms["acp_first"] - ms["http_first_text"],
        "answer_acp_p50_ms": ms["acp_answer"],
        "answer_http_p50_ms": ms["http_answer"],
        "cell_turn_acp_p50_ms": ms["acp_cell_1"],
        "cell_turn_http_p50_ms": ms["http_cell_1"],
        "per_cell_acp_ms": per_cell["acp"],
        "per_cell_http_ms": per_cell["http"],
        "per_cell_overhead_ms": per_cell["acp"] - per_cell["http"],
        "model_requests": float(requests),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="rounds, each: ACP and HTTP, three turns each")
    ap.add_argument("--cells", type=int, default=8, help="cells in the long turn (per-cell cost: against one cell)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "acp.json"))
    args = ap.parse_args()
    if args.cells < 2:
        ap.error("--cells must be at least 2")
    targets = {
        "status_p50_ms": ("baseline: GET /v1/status round trip p50 (ms)", None),
        "first_update_acp_p50_ms": ("ACP: prompt to first agent_message_chunk p50 (ms)", None),
        "first_update_acp_p90_ms": ("ACP: prompt to first agent_message_chunk p90 (ms)", None),
        "first_text_http_p50_ms": ("HTTP: prompt to first model.delta p50 (ms)", None),
        "first_text_http_p90_ms": ("HTTP: prompt to first model.delta p90 (ms)", None),
        "first_event_http_p50_ms": ("HTTP: prompt to turn.started p50 (ms)", None),
        "first_update_overhead_ms": ("ACP - HTTP, first text (ms)", None),
        "answer_acp_p50_ms": ("ACP: answer-only turn, prompt to response p50 (ms)", None),
        "answer_http_p50_ms": ("HTTP: answer-only turn, prompt to turn.finished (ms)", None),
        "cell_turn_acp_p50_ms": ("ACP: one-cell turn p50 (ms)", None),
        "cell_turn_http_p50_ms": ("HTTP: one-cell turn p50 (ms)", None),
        "per_cell_acp_ms": (f"ACP: per cell, {args.cells}-cell turn vs 1 (ms)", None),
        "per_cell_http_ms": (f"HTTP: per cell, {args.cells}-cell turn vs 1 (ms)", None),
        "per_cell_overhead_ms": ("ACP - HTTP, per cell (ms)", None),
        "model_requests": ("model requests served (as many as the turns make)", None),
    }

    started, load = time.perf_counter(), load_average()
    figures = in_a_home("bench-acp-", lambda home: run(args, home))
    total = time.perf_counter() - started
    print_table(figures, targets, total)
    save(args.out, {"figures": figures, "args": {k: v for k, v in vars(args).items() if k != "out"}, "total_s": total},
         load)


if __name__ == "__main__":
    main()
