"""Crash-recovery benchmark: prints a table and writes bench/results/faults.json.

    .venv/bin/python bench/faults.py [-n 50] [--lines 200] [--cell-s 1.0] [--seed 0]

Each trial is the daemon killed with SIGKILL in the middle of a turn, and restarted:

1. a daemon (`daemon.client.spawn`, as users get it) for a fresh PRIME_AGENT_HOME of the trial's own
   (pool_size 1), one session on the fake OpenAI server, a client following its events;
2. a prompt whose cell starts a child process (`sleep`, standing for whatever a cell leaves running)
   and prints `--lines` lines over `--cell-s` seconds; at a random moment of it (uniform from the
   prompt's acceptance to 90% of the cell's length) the daemon's process tree is read and the
   daemon gets SIGKILL;
3. the daemon is started again on the same home; the client's stream resumes by itself (from its
   last id) and must see the cut turn finish;
4. checks: the session is listed; the client saw every event once, numbered 1, 2, 3, ...; the
   journal replays (from 0) contiguous seqs 1..N with no gap or repeat, holding every event the
   client saw live, unchanged; the cut turn has exactly one `turn.finished`, `interrupted`; a new
   prompt on the woken session completes (a new kernel runs its cell); and of the processes the
   dead daemon left (its kernels and their children, read just before the kill), how many are
   still alive once the new daemon serves and the new turn is done ("leftover processes": reported,
   not a failed trial, until the restart reaps them).

Loopback only: the fake model server listens on 127.0.0.1, the daemon on its Unix socket. Each
trial is bounded (`--trial-timeout`), and whatever it leaves alive is killed before the next one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.events import Event  # noqa: E402
from agent.testing.openai_server import OpenAIServer  # noqa: E402
from bench.daemon import agent_script, processes_of  # noqa: E402
from bench.kernel import descendants, pct, print_table  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from daemon.client import Client, DaemonUnavailable, spawn  # noqa: E402
from daemon.paths import socket_file  # noqa: E402


@dataclass
class Trial:
    n: int
    kill_after_s: float = 0.0
    """From the prompt's acceptance to the SIGKILL."""
    killed_in: str = ""
    """What the client had seen of the turn at the kill: "model" (no cell yet), "cell", "output"."""
    events_seen: int = 0
    """Events the following client received (before the kill and after the restart)."""
    events_lost: int = 0
    """Events the client saw live that the journal does not replay (or replays as another event)."""
    journal_events: int = 0
    gaps: int = 0
    repeats: int = 0
    leftovers: int = 0
    """Processes of the dead daemon's tree still alive after the restart and the new turn."""
    leftover_cmds: list[str] = field(default_factory=list)
    restart_s: float = 0.0
    """From the SIGKILL to the new daemon answering."""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    """The end of the daemon's log, kept for a failed trial."""

    @property
    def passed(self) -> bool:
        return not self.problems


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), telling a reused pid from the process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def alive(pid: int, started: int | None) -> bool:
    try:
        if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return False
    except OSError:
        return False
    return start_time(pid) == started


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


class Daemon:
    """One daemon process for `home`; `kill()` is SIGKILL, `stop()` SIGTERM (it drains)."""

    def __init__(self, home: Path):
        self.home = home
        self.proc: subprocess.Popen | None = None

    async def start(self, timeout: float = 60.0) -> None:
        os.environ["PRIME_AGENT_HOME"] = str(self.home)  # spawn() and socket_file() read it
        self.proc = spawn()
        async with Client(socket=socket_file(), timeout=10.0) as probe:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    await probe.status()
                    return
                except DaemonUnavailable:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the daemon did not start (exit {self.proc.poll()})") from None
                    await asyncio.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            print(f"the daemon {self.proc.pid} ignored SIGTERM for 40 s; killing it", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def the_cell(lines: int, seconds: float) -> str:
    return ("run: import subprocess, time\n"
            "child = subprocess.Popen(['sleep', '300'])\n"
            f"for i in range({lines}):\n"
            "    print('line', i, flush=True)\n"
            f"    time.sleep({seconds / lines!r})")


async def follow(client: Client, sid: str, seen: list[Event], cut_turn: str) -> None:
    """Every event of the session, into `seen`, until `cut_turn` finishes (across the restart)."""
    async for e in client.events(sid, reconnect=90.0):
        seen.append(e)
        if e.type == "turn.finished" and e.turn_id == cut_turn:
            return


async def replay(client: Client, sid: str, last: int) -> list[Event]:
    """The journal from the start, until event `last`."""
    out: list[Event] = []
    if last == 0:
        return out
    async for e in client.events(sid, after=0, reconnect=0):
        out.append(e)
        if e.seq >= last:
            return out
    return out


def check_seqs(events: list[Event], what: str, t: Trial) -> None:
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        missing = sorted(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
        twice = len(seqs) - len(set(seqs))
        t.problems.append(f"{what}: seqs not 1..{len(seqs)} ({len(missing)} missing, {twice} repeated)")
        if what == "journal":
            t.gaps, t.repeats = len(missing), twice


async def trial(t: Trial, home: Path, project: Path, url: str, args: argparse.Namespace, rng: random.Random) -> None:
    started = time.perf_counter()
    first, second = Daemon(home), Daemon(home)
    tree: dict[int, int | None] = {}
    try:
        await first.start()
        async with Client(socket=socket_file(), timeout=30.0) as client:
            s = await client.create_session(project, model="fake", base_url=url)
            seen: list[Event] = []
            accepted = await client.send(s.id, the_cell(args.lines, args.cell_s))
            follower = asyncio.create_task(follow(client, s.id, seen, accepted.turn_id))
            t0 = time.perf_counter()
            await asyncio.sleep(rng.uniform(0, 0.9 * args.cell_s))
            if follower.done():
                t.problems.append("the turn finished before the kill (not a crash trial)")
            assert first.proc is not None
            tree = {pid: start_time(pid) for pid in descendants(first.proc.pid)}
            first.kill()
            t.kill_after_s = time.perf_counter() - t0
            types = {e.type for e in seen}
            t.killed_in = "output" if "cell.output" in types else "cell" if "cell.started" in types else "model"
            live_count = len(seen)

            killed = time.perf_counter()
            await second.start()
            t.restart_s = time.perf_counter() - killed
            await asyncio.wait_for(follower, 60)  # the stream resumes by itself, from its last id
            t.events_seen = len(seen)
            check_seqs(seen, "client", t)
            cut = [e for e in seen if e.type == "turn.finished" and e.turn_id == accepted.turn_id]
            if len(cut) != 1 or cut[0].outcome != "interrupted":
                t.problems.append(f"the cut turn finished {len(cut)} times, "
                                  f"{[e.outcome for e in cut]} (want once, interrupted)")

            listed = {x.id: x for x in await client.sessions()}
            if s.id not in listed:
                t.problems.append("the session is not listed after the restart")
            next_turn = await client.send(s.id, "run: print(6 * 7)")
            done = await asyncio.wait_for(client.wait_turn(s.id, next_turn.turn_id, after=seen[-1].seq), 60)
            if done.outcome != "completed" or "42" not in (done.answer or ""):
                t.problems.append(f"the new prompt did not complete: {done.outcome} {done.error or done.answer!r}")

            info = await client.session(s.id)
            journal = await asyncio.wait_for(replay(client, s.id, info.last_seq), 60)
            t.journal_events = len(journal)
            check_seqs(journal, "journal", t)
            finished = [e for e in journal if e.type == "turn.finished"]
            if [(e.turn_id, e.outcome) for e in finished] != [(accepted.turn_id, "interrupted"),
                                                              (next_turn.turn_id, "completed")]:
                t.problems.append(f"the journal's turn.finished events: {[(e.turn_id, e.outcome) for e in finished]}")
            by_seq = {e.seq: e for e in journal}
            lost = [e.seq for e in seen[:live_count]
                    if e.seq not in by_seq or by_seq[e.seq].model_dump() != e.model_dump()]
            t.events_lost = len(lost)
            if lost:
                t.problems.append(f"{len(lost)} events the client saw live are not replayed as they were: {lost[:5]}")

            deadline = time.monotonic() + args.grace  # a kernel whose parent died notices within ~1 s
            while any(alive(p, st) for p, st in tree.items()) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            left = [p for p, st in tree.items() if alive(p, st)]
            t.leftovers, t.leftover_cmds = len(left), [cmdline(p) for p in left]
    except Exception as e:
        t.problems.append(f"{type(e).__name__}: {e}")
    finally:
        await asyncio.to_thread(second.stop)
        if first.proc is not None and first.proc.poll() is None:
            first.kill()
        for pid in {p for p, st in tree.items() if alive(p, st)} | set(processes_of(str(home))):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        t.seconds = time.perf_counter() - started


TARGETS = {
    "trials": ("trials", None),
    "trials_passed": ("trials passed", None),
    "trials_failed": ("trials failed", 0.0),
    "killed_before_cell": ("killed before the cell began", None),
    "killed_in_cell": ("killed in the cell, before its first output", None),
    "killed_in_output": ("killed while the cell printed", None),
    "events_seen": ("events the client saw (all trials)", None),
    "events_lost": ("events lost (seen live, not replayed as seen)", 0.0),
    "journal_gaps": ("journal seqs missing", 0.0),
    "journal_repeats": ("journal seqs repeated", 0.0),
    "leftover_processes": ("leftover processes of the killed daemons", None),
    "trials_with_leftovers": ("trials with leftover processes", None),
    "restart_p50_s": ("kill to the new daemon answering, p50 (s)", None),
    "trial_p50_s": ("seconds per trial, p50", None),
    "trial_max_s": ("seconds per trial, max", None),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--trials", type=int, default=50, help="crash-recovery trials")
    ap.add_argument("--lines", type=int, default=200, help="lines the cell prints")
    ap.add_argument("--cell-s", type=float, default=1.0, help="seconds the cell prints for")
    ap.add_argument("--grace", type=float, default=3.0,
                    help="seconds a killed daemon's process may take to exit after the new turn (then it is left)")
    ap.add_argument("--trial-timeout", type=float, default=180.0, help="seconds a trial may take before it fails")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)

    started, load = time.perf_counter(), load_average()
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp, OpenAIServer(agent_script) as server:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / ".git").mkdir()
        for n in range(1, args.trials + 1):
            home = root / f"home-{n}"
            home.mkdir()
            (home / "config.toml").write_text("[daemon]\npool_size = 1\n")
            t = Trial(n)
            try:
                asyncio.run(asyncio.wait_for(trial(t, home, project, server.base_url, args, rng), args.trial_timeout))
            except TimeoutError:
                t.problems.append(f"the trial took over {args.trial_timeout:g} s")
            trials.append(t)
            mark = "ok" if t.passed else "FAIL: " + "; ".join(t.problems)
            print(f"trial {n:>3}: killed after {t.kill_after_s:.2f} s ({t.killed_in or '-'}), {t.events_seen} events, "
                  f"{t.leftovers} left, {t.seconds:.1f} s  {mark}", file=sys.stderr)
            if not t.passed:
                with contextlib.suppress(OSError):
                    t.log_tail = (home / "run" / "daemon.log").read_text(errors="replace").splitlines()[-30:]
            shutil.rmtree(home, ignore_errors=True)
    total = time.perf_counter() - started

    figures = {
        "trials": len(trials),
        "trials_passed": sum(t.passed for t in trials),
        "trials_failed": sum(not t.passed for t in trials),
        "killed_before_cell": sum(t.killed_in == "model" for t in trials),
        "killed_in_cell": sum(t.killed_in == "cell" for t in trials),
        "killed_in_output": sum(t.killed_in == "output" for t in trials),
        "events_seen": sum(t.events_seen for t in trials),
        "events_lost": sum(t.events_lost for t in trials),
        "journal_gaps": sum(t.gaps for t in trials),
        "journal_repeats": sum(t.repeats for t in trials),
        "leftover_processes": sum(t.leftovers for t in trials),
        "trials_with_leftovers": sum(t.leftovers > 0 for t in trials),
        "restart_p50_s": statistics.median([t.restart_s for t in trials if t.restart_s] or [0.0]),
        "trial_p50_s": statistics.median([t.seconds for t in trials] or [0.0]),
        "trial_max_s": pct([t.seconds for t in trials], 1.0) if trials else 0.0,
    }
    print_table(figures, TARGETS, total)
    problems: dict[str, int] = {}
    for t in trials:
        for p in t.problems:
            problems[p] = problems.get(p, 0) + 1
    for p, count in sorted(problems.items(), key=lambda kv: -kv[1]):
        print(f"  {count} x {p}")
    left = sorted({c for t in trials for c in t.leftover_cmds})
    if left:
        print("left alive: " + ", ".join(left))
    save(args.out, {"figures": figures, "args": {k: v for k, v in vars(args).items() if k != "out"}, "total_s": total,
                    "trials": [asdict(t) for t in trials]}, load)
    return 1 if figures["trials_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
