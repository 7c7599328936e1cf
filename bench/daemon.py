"""Daemon benchmark: prints a table and writes bench/results/daemon.json.

    .venv/bin/python bench/daemon.py [--creates 10] [--turns 8] [--lines 1000] [--replay 10000] [--idle 20]

Every figure goes through the real client (daemon/client.py) over the Unix socket, to `python -m
daemon` running as its own process (as `daemon.client.spawn` starts it) with real kernels and the
fake OpenAI server as the model; each part has its own fresh PRIME_AGENT_HOME. Measures:

- session create latency (POST /v1/sessions until its 201), p50/p90: warm (a pooled kernel ready
  and the pool otherwise idle: it is full before each create) and cold (pool_size 0);
- prompt to first event: POST .../messages until the turn's `turn.started` arrives on an event
  stream already open; and until its `turn.finished`, for an answer-only turn and a one-cell turn;
- events per second to one client, live: a cell printing many lines, one flushed print each
  (about one `cell.output` event each), counted from the first output event to the last; beside
  it the rate the cell printed at, the rate the daemon made the events at, each event's delay
  from its making to its arrival (small delays: the client keeps up with the daemon), and the
  printed characters the runtime never received (there should be none; past the output limit
  the middle is cut by design and counted, not lost);
- replay of 10,000 events (GET .../events?after=0 until the 10,000th arrives) from a journal made
  of real turns repeated out to 10,000 events: through the client (which parses every event), and
  raw (SSE frames counted, nothing parsed): the raw replay throughput;
- memory with 20 idle sessions (pool_size 2): the daemon's PSS (and its growth from an empty
  daemon), and the PSS of its kernels (the sessions' and the pool's) summed;
- the baseline: a GET /v1/status round trip over the socket (this machine's speed varies ~2x
  over a day, so read the other figures against it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402

from agent.events import Event, parse_event  # noqa: E402
from agent.layout import SessionLayout  # noqa: E402
from agent.testing.openai_server import OpenAIServer, Reply  # noqa: E402
from bench.kernel import descendants, pct, print_table, pss_kb  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from daemon import meta as meta_file  # noqa: E402
from daemon.client import Client, DaemonUnavailable, spawn  # noqa: E402
from daemon.paths import log_file, socket_file  # noqa: E402


def agent_script(request: dict[str, Any]) -> Reply:
    """The fake model (as in tests/daemon/conftest.py): `run: CODE` runs CODE in a cell, then answers
    with its output; any other prompt is echoed back as the answer."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content="ran: " + messages[-1]["content"][:200])
    prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if m := re.search(r"run: (.*)", prompt, re.DOTALL):
        return Reply(code=[m.group(1)])
    return Reply(content="echo: " + prompt.rsplit("\n\n", 1)[-1])


def in_a_home(prefix: str, main: Callable[[Path], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """`main(home)` run under a temporary $PRIME_AGENT_HOME (set before anything starts); whatever it
    left running there is killed, and said."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.environ["PRIME_AGENT_HOME"] = tmp
        try:
            return asyncio.run(main(Path(tmp)))
        finally:
            left = processes_of(tmp)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if left:
                print(f"killed processes left behind: {left}", file=sys.stderr)


def processes_of(home: str) -> list[int]:
    """Live processes whose command line or environment names `home`: a daemon of ours (its
    PRIME_AGENT_HOME) and its kernels (their connection files)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.name != str(os.getpid()) and any(
                    home.encode() in (proc / part).read_bytes() for part in ("cmdline", "environ")):
                if "\nState:\tZ" not in (proc / "status").read_text():
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


# --- a daemon process --------------------------------------------------------------------------


class Daemon:
    """`async with Daemon(home, pool_size=2) as client`: the daemon (`daemon.client.spawn`) for a fresh home, with
    `[daemon]` settings in its config.toml; stopped with SIGTERM (it drains) at exit, then anything
    of its still alive is killed."""

    def __init__(self, home: Path, **settings: int | float):
        self.home = home
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self.client: Client | None = None

    async def __aenter__(self) -> Client:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text("[daemon]\n" + "".join(f"{k} = {v!r}\n" for k, v in self.settings.items()))
        os.environ["PRIME_AGENT_HOME"] = str(self.home)  # spawn(), socket_file() and log_file() read it
        self.proc = spawn()
        self.client = Client(socket=socket_file(), timeout=120.0)
        deadline = time.monotonic() + 60
        while True:
            try:
                await self.client.status()
                return self.client
            except DaemonUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    await self.__aexit__()
                    raise RuntimeError(f"the daemon did not start; see {log_file()}") from None
                await asyncio.sleep(0.02)

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
        if self.proc is not None:
            await asyncio.to_thread(self.stop)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                print(f"the daemon {self.proc.pid} ignored SIGTERM for 40 s; killing it", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        left = processes_of(str(self.home))
        if left:
            print(f"processes left by the daemon of {self.home}: {left}; killing them", file=sys.stderr)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def until(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        await asyncio.sleep(0.01)


async def pool_full(client: Client, size: int) -> None:
    async def full() -> bool:
        return (await client.status()).pool_ready >= size

    await until(full)


class Follower:
    """One event stream, opened once and read in the background: (arrival time, event) in order;
    `lags` holds each event's delay from its making in the daemon (its `ts`) to its arrival here."""

    def __init__(self, client: Client, session_id: str, after: int):
        self.arrivals: asyncio.Queue[tuple[float, Event]] = asyncio.Queue()
        self.lags: dict[int, float] = {}

        async def follow() -> None:
            async for e in client.events(session_id, after):
                self.arrivals.put_nowait((time.perf_counter(), e))
                self.lags[e.seq] = time.time() - e.ts

        self.task = asyncio.create_task(follow())

    async def until(self, turn_id: str, type: str) -> float:
        """Arrival time of the turn's first event of `type` (events before it are passed over)."""
        while True:
            t, e = await asyncio.wait_for(self.arrivals.get(), 120)
            if e.turn_id == turn_id and e.type == type:
                return t

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


# --- the parts ---------------------------------------------------------------------------------


async def status_round_trip(client: Client, n: int) -> list[float]:
    times = []
    for _ in range(n + 20):
        t = time.perf_counter()
        await client.status()
        times.append(time.perf_counter() - t)
    return times[20:]  # warm-up


async def creates(client: Client, project: Path, url: str, n: int, pool_size: int) -> list[float]:
    """Create (timed) and delete (not timed) n sessions, one at a time; with a pool, it is full first."""
    times = []
    for _ in range(n):
        if pool_size:
            await pool_full(client, pool_size)
        t = time.perf_counter()
        s = await client.create_session(project, model="fake", base_url=url)
        times.append(time.perf_counter() - t)
        await client.delete(s.id)
    return times


async def turns(client: Client, follower: Follower, session_id: str, n: int) -> dict[str, float]:
    """Prompt to first event and to the end, for n answer-only and n one-cell turns."""
    out: dict[str, float] = {}
    turn = await client.send(session_id, "warm up: the stream opens, the model client connects")
    await follower.until(turn.turn_id, "turn.finished")
    first: list[float] = []
    for name, prompt in (("answer", "hello"), ("cell", "run: 6 * 7")):
        finished = []
        for _ in range(n):
            t = time.perf_counter()
            turn = await client.send(session_id, prompt)
            first.append(await follower.until(turn.turn_id, "turn.started") - t)
            finished.append(await follower.until(turn.turn_id, "turn.finished") - t)
        out[f"turn_{name}_finished_p50_ms"] = statistics.median(finished) * 1e3
    out["first_event_p50_ms"] = statistics.median(first) * 1e3
    out["first_event_p90_ms"] = pct(first, 0.9) * 1e3
    return out


async def live(client: Client, follower: Follower, session_id: str, lines: int, limit: float) -> dict[str, float]:
    """The live event rate of a cell printing `lines` numbered lines, flushing each; and how many
    of them were lost. A cell that has not ended after `limit` seconds is interrupted."""
    code = (f"import time as _t\n_t0 = _t.perf_counter()\nfor i in range({lines}):\n    print(i, flush=True)\n"
            f"print('lines/s', {lines} / (_t.perf_counter() - _t0), flush=True)")
    turn = await client.send(session_id, "run: " + code)
    seen: list[float] = []
    made: list[float] = []
    lags: list[float] = []
    text: list[str] = []
    result = None
    hung = False
    deadline = time.monotonic() + limit
    while True:
        try:
            t, e = await asyncio.wait_for(follower.arrivals.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            # Seen with thousands of lines: past ZMQ's high-water mark (1000 messages) iopub messages
            # are dropped, the cell's idle status with them, and the kernel runtime waits for it.
            hung = True
            await client.interrupt(session_id)
            deadline = time.monotonic() + 60
            continue
        if e.turn_id != turn.turn_id:
            continue
        if e.type == "cell.output":
            seen.append(t)
            made.append(e.ts)
            lags.append(follower.lags[e.seq])
            text.append(e.text)
        elif e.type == "cell.finished":
            result = e.result
        elif e.type == "turn.finished":
            break
    printed = "".join(text)
    stdout = result.stdout if result else ""
    rate = re.search(r"lines/s (\S+)", stdout)
    # Past the output limit the middle of a cell's output is cut by design (the model sees head and
    # tail; only the head streams live). The runtime counts every character it received: any
    # shortfall against what the cell printed was lost on the way.
    cut = re.search(r"\[\.\.\. [\d,]+ of ([\d,]+) characters cut", stdout)
    received = int(cut.group(1).replace(",", "")) if cut else len(stdout)
    last_line = stdout.rstrip("\n").rsplit("\n", 1)[-1] + "\n"
    expected = sum(len(f"{i}\n") for i in range(lines)) + len(last_line)
    return {
        "live_events": len(seen),  # about one a print: the kernel may merge prints, or split one
        "live_events_per_s": (len(seen) - 1) / (seen[-1] - seen[0]) if len(seen) > 1 else 0.0,
        "live_made_per_s": (len(made) - 1) / (made[-1] - made[0]) if len(made) > 1 else 0.0,
        "live_kernel_lines_per_s": float(rate.group(1)) if rate else 0.0,
        "live_lag_p50_ms": pct(lags, 0.5) * 1e3 if lags else 0.0,
        "live_lag_max_ms": max(lags, default=0.0) * 1e3,
        "live_chars_lost": expected - received,
        "live_shown_lines": len({w for w in printed.split() if w.isdigit()}),
        "live_hung": float(hung),
    }


def extend_journal(layout: SessionLayout, target: int) -> int:
    """Repeat the session's real turns (renumbered: seq, turn id) until the journal holds `target`
    events; the daemon must be stopped. Returns the journal's last seq."""
    path = layout.events
    events = [parse_event(line) for line in path.read_text().splitlines() if line]
    by_turn: dict[str, list[Event]] = {}
    for e in events:
        if e.turn_id is not None:
            by_turn.setdefault(e.turn_id, []).append(e)
    templates = list(by_turn.values())
    meta = meta_file.load(layout)
    seq, ts, lines = events[-1].seq, events[-1].ts, []
    while seq < target:
        for template in templates:
            meta.assigned += 1
            meta.turns += 1
            for e in template:
                seq += 1
                ts += 0.001
                lines.append(e.model_copy(update={"seq": seq, "ts": ts, "turn_id": f"t{meta.assigned}"}).model_dump_json())
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")
    meta.save(layout)
    return seq


async def replay(client: Client, session_id: str, n: int, repeats: int) -> dict[str, float]:
    """Seconds to receive the first n events from seq 1: through the client, and as raw SSE frames."""
    parsed, raw = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        count = 0
        async with contextlib.aclosing(client.events(session_id, after=0, reconnect=0)) as stream:
            async for e in stream:
                count += 1
                if count == n:
                    break
        parsed.append(time.perf_counter() - t)
        assert e.seq == n, f"event {count} had seq {e.seq}"

    transport = httpx2.AsyncHTTPTransport(uds=str(socket_file()))
    async with httpx2.AsyncClient(transport=transport, base_url="http://daemon", timeout=60) as http:
        for _ in range(repeats):
            t = time.perf_counter()
            count, tail = 0, b""
            async with http.stream("GET", f"/v1/sessions/{session_id}/events", params={"after": 0}) as r:
                async for chunk in r.aiter_raw():
                    count += (tail + chunk[:1]).count(b"\n\n") + chunk.count(b"\n\n")
                    tail = chunk[-1:]
                    if count >= n:
                        break
            raw.append(time.perf_counter() - t)
    return {"replay_ms": statistics.median(parsed) * 1e3, "replay_first_ms": parsed[0] * 1e3,
            "replay_raw_ms": statistics.median(raw) * 1e3, "replay_raw_events_per_s": n / statistics.median(raw)}


async def memory(daemon: Daemon, client: Client, project: Path, url: str, n: int, pool_size: int) -> dict[str, float]:
    await pool_full(client, pool_size)
    empty = pss_kb(daemon.pid)
    for _ in range(n):
        await client.create_session(project, model="fake", base_url=url)
    await pool_full(client, pool_size)
    await asyncio.sleep(2.0)  # idle: whatever the kernels do just after starting is over
    kernels = descendants(daemon.pid)
    status = await client.status()
    assert status.live_sessions == n, status
    return {"daemon_pss_mb": pss_kb(daemon.pid) / 1024, "daemon_pss_empty_mb": empty / 1024,
            "kernels_pss_mb": sum(pss_kb(pid) for pid in kernels) / 1024, "kernels": len(kernels)}


# --- the run -----------------------------------------------------------------------------------


async def run(args: argparse.Namespace, root: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    project = root / "project"
    project.mkdir()
    with OpenAIServer(agent_script) as server:
        url = server.base_url
        print("warm pool: status round trip, creates, turns, live events", file=sys.stderr)
        async with Daemon(root / "warm", pool_size=args.pool) as client:
            rt = await status_round_trip(client, 200)
            figures["status_p50_ms"] = statistics.median(rt) * 1e3
            warm = await creates(client, project, url, args.creates, args.pool)
            figures["create_warm_p50_ms"], figures["create_warm_p90_ms"] = pct(warm, 0.5) * 1e3, pct(warm, 0.9) * 1e3
            await pool_full(client, args.pool)
            s = await client.create_session(project, model="fake", base_url=url)
            await pool_full(client, args.pool)  # the kernel that replaces the one taken is up: no boot runs
            follower = Follower(client, s.id, s.last_seq)
            try:
                figures.update(await turns(client, follower, s.id, args.turns))
                figures.update(await live(client, follower, s.id, args.lines, limit=30))
            finally:
                await follower.close()
            templates = await client.create_session(project, model="fake", base_url=url)
            for prompt in ("hello", "run: x = 6 * 7\nprint(x)"):
                turn = await client.send(templates.id, prompt)
                await client.wait_turn(templates.id, turn.turn_id)

        print("replay", file=sys.stderr)
        journal = SessionLayout.of(templates.id, root / "warm")
        figures["replay_events"] = extend_journal(journal, args.replay)
        figures["replay_journal_mb"] = journal.events.stat().st_size / 2**20
        async with Daemon(root / "warm", pool_size=0) as client:
            figures.update(await replay(client, templates.id, args.replay, args.repeats))

        print("cold creates", file=sys.stderr)
        async with Daemon(root / "cold", pool_size=0) as client:
            cold = await creates(client, project, url, args.creates, 0)
            figures["create_cold_p50_ms"], figures["create_cold_p90_ms"] = pct(cold, 0.5) * 1e3, pct(cold, 0.9) * 1e3

        print(f"memory: {args.idle} idle sessions", file=sys.stderr)
        daemon = Daemon(root / "memory", pool_size=2)
        async with daemon as client:
            figures.update(await memory(daemon, client, project, url, args.idle, 2))
    return figures


TARGETS = {
    "status_p50_ms": ("baseline: GET /v1/status round trip p50 (ms)", None),
    "create_warm_p50_ms": ("session create, warm pool, p50 (ms)", 50.0),
    "create_warm_p90_ms": ("session create, warm pool, p90 (ms)", None),
    "create_cold_p50_ms": ("session create, no pool, p50 (ms)", None),
    "create_cold_p90_ms": ("session create, no pool, p90 (ms)", None),
    "first_event_p50_ms": ("prompt to turn.started on the stream, p50 (ms)", None),
    "first_event_p90_ms": ("prompt to turn.started on the stream, p90 (ms)", None),
    "turn_answer_finished_p50_ms": ("prompt to turn.finished, answer only, p50 (ms)", None),
    "turn_cell_finished_p50_ms": ("prompt to turn.finished, one cell, p50 (ms)", None),
    "live_events": ("live: cell.output events received", None),
    "live_events_per_s": ("live: events/s to one client", None),
    "live_kernel_lines_per_s": ("live: lines/s the cell printed (the source)", None),
    "live_made_per_s": ("live: events/s the daemon made (from their ts)", None),
    "live_lag_p50_ms": ("live: event made to received, p50 (ms)", None),
    "live_lag_max_ms": ("live: event made to received, max (ms)", None),
    "live_chars_lost": ("live: printed characters lost", 0.0),
    "live_shown_lines": ("live: lines shown live (the head, within the output limit)", None),
    "live_hung": ("live: cell hung, interrupted (1: yes)", 0.0),
    "replay_events": ("replay: events in the journal", None),
    "replay_journal_mb": ("replay: journal size (MB)", None),
    "replay_ms": ("replay: 10,000 events, client, median (ms)", 200.0),
    "replay_first_ms": ("replay: 10,000 events, client, first (ms)", None),
    "replay_raw_ms": ("replay: 10,000 events, raw SSE, median (ms)", None),
    "replay_raw_events_per_s": ("replay: raw events/s", None),
    "daemon_pss_empty_mb": ("memory: daemon PSS, no sessions (MB)", None),
    "daemon_pss_mb": ("memory: daemon PSS, 20 idle sessions (MB)", None),
    "kernels_pss_mb": ("memory: kernels' PSS summed (MB)", None),
    "kernels": ("memory: kernel processes (sessions + pool)", None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--creates", type=int, default=10, help="timed session creates, warm and cold each")
    ap.add_argument("--pool", type=int, default=2, help="pool_size of the warm daemon")
    ap.add_argument("--turns", type=int, default=8, help="timed turns of each kind (answer only, one cell)")
    ap.add_argument("--lines", type=int, default=1000,
                    help="lines the live-rate cell prints (past ~2000 the kernel may drop output: see live())")
    ap.add_argument("--replay", type=int, default=10_000, help="events to replay")
    ap.add_argument("--repeats", type=int, default=5, help="replays of each kind (client, raw)")
    ap.add_argument("--idle", type=int, default=20, help="idle sessions for the memory figure")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "daemon.json"))
    args = ap.parse_args()
    TARGETS["replay_ms"] = (f"replay: {args.replay:,} events, client, median (ms)", 200.0 if args.replay == 10_000 else None)
    TARGETS["daemon_pss_mb"] = (f"memory: daemon PSS, {args.idle} idle sessions (MB)", None)

    started, load = time.perf_counter(), load_average()
    figures = in_a_home("bench-daemon-", lambda home: run(args, home))  # each part moves to a home of its own
    total = time.perf_counter() - started

    print_table(figures, TARGETS, total)
    save(args.out, {"figures": figures, "args": {k: v for k, v in vars(args).items() if k != "out"}, "total_s": total},
         load)


if __name__ == "__main__":
    main()
