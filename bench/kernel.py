"""Kernel runtime and whole-system benchmark: prints a table and writes bench/results/kernel.json.

    .venv/bin/python bench/kernel.py [--cells 60] [--repeats 3]

Measures: kernel start to ready (with bootstrap); the sandbox's cost (agent/kernel/sandbox.py): a session's
kernel start and a cell's round trip in `workspace-write` against `full-access` (no sandbox), the two
interleaved so the machine's drift falls on both alike (and against `workspace-write` without its seccomp
filter, `sandbox.seccomp = false`: the filter's own cost), and the time the session's view takes to
apply (nsenter and mount, what a pooled kernel pays when a session takes it); kernel shutdown (a shutdown request, then the
kernel's own exit); a trivial cell's round trip through the runtime (p50/p99); a host-bridge call
from inside a cell (p50/p99); a cell printing 1 MB;
`prime-agent run` against a local OpenAI-compatible server: the cost of one more cell
((N+1-cell run - 1-cell run) / N, the two sizes interleaved, each pair giving one figure), the wall
time of a 1-cell run, and the session's memory (PSS summed over the CLI process and its kernel);
beside them, between the pairs, the floor they build on: a bare jupyter_client round trip on a
kernel of its own (this machine's speed drifts 2x within minutes: read one more cell against it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config_models import Config, SandboxConfig  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.openai_server import OpenAIServer, Reply  # noqa: E402
from agent.testing.scripted import ScriptedModel  # noqa: E402
from agent.kernel.manager import _handshake, _Manager, _open_client, _stop  # noqa: E402
from agent.kernel.sandbox import Box, Launch  # noqa: E402
from agent.types import Cell  # noqa: E402
from bench.report import load_average, save  # noqa: E402

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def print_table(figures: dict[str, float], targets: dict[str, tuple[str, float | None]], total: float) -> None:
    """The benchmarks' table: each of `targets` (key -> label, upper bound or None) with its figure."""
    print(f"{'measure':<50} {'value':>10} {'target':>8}")
    for key, (label, target) in targets.items():
        value = figures[key]
        mark = "" if target is None else ("ok" if value <= target else "MISS")
        print(f"{label:<50} {value:>10.3f} {'' if target is None else '<= %g' % target:>8} {mark}")
    print(f"{'total bench time (s)':<50} {total:>10.1f}")


@contextlib.contextmanager
def home_in(path: Path):
    """PRIME_AGENT_HOME at `path` inside (the kernels' journals go there), as it was after: a home left
    pointing at a removed folder had the next kernel launched make it again."""
    before = os.environ.get("PRIME_AGENT_HOME")
    os.environ["PRIME_AGENT_HOME"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PRIME_AGENT_HOME", None)
        else:
            os.environ["PRIME_AGENT_HOME"] = before


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def runtime_figures(n_cells: int, n_starts: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, home_in(Path(tmp)):
        starts, shutdowns = [], []
        for _ in range(n_starts):
            s = Session(Config(), ScriptedModel([]), cwd=Path(tmp))
            t = time.perf_counter()
            await s.start()
            starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            await s.kernel.shutdown()
            shutdowns.append(time.perf_counter() - t)
            await s.close()
        out["kernel_start_s"] = statistics.median(starts)
        out["kernel_shutdown_s"] = statistics.median(shutdowns)

        async with Session(Config(), ScriptedModel([]), cwd=Path(tmp)) as s:
            k = s.kernel
            times = []
            for i in range(n_cells + 50):
                t = time.perf_counter()
                await k.execute(Cell(id="c", code="1+1"))
                times.append(time.perf_counter() - t)
            times = times[50:]  # warm-up
            out["cell_p50_ms"], out["cell_p99_ms"] = pct(times, 0.5) * 1e3, pct(times, 0.99) * 1e3

            code = (
                "import time as _t\n_ts = []\nfor _ in range(2000):\n    _a = _t.perf_counter(); host.call('ping')"
                "\n    _ts.append(_t.perf_counter() - _a)\n_ts = sorted(_ts[200:])\nprint(_ts[len(_ts)//2], _ts[int(len(_ts)*.99)])"
            )
            r = await k.execute(Cell(id="c", code=code))
            p50, p99 = map(float, r.stdout.split())
            out["host_call_p50_ms"], out["host_call_p99_ms"] = p50 * 1e3, p99 * 1e3

            # The same cell through bare jupyter_client on the same kernel: the floor we build on,
            # measured in the same conditions (this machine's speed varies by 2x over a day).
            raw = await round_trips(k._kc, n_cells + 50)
            out["raw_jupyter_client_p50_ms"] = pct(raw[50:], 0.5) * 1e3

            mb = []
            for _ in range(5):
                t = time.perf_counter()
                await k.execute(Cell(id="c", code="print('x' * 1_000_000)"))
                mb.append(time.perf_counter() - t)
            out["output_1mb_ms"] = statistics.median(mb) * 1e3
    return out


async def round_trips(kc, n: int) -> list[float]:
    """Seconds of each of n `1+1` cells through bare jupyter_client: execute, then IOPub until idle."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        msg_id = kc.execute("1+1")
        while True:
            m = await kc.get_iopub_msg()
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status" \
                    and m["content"]["execution_state"] == "idle":
                break
        times.append(time.perf_counter() - t)
    while await kc.shell_channel.msg_ready():
        await kc.shell_channel.get_msg()
    return times


@contextlib.asynccontextmanager
async def bare_kernel():
    """A client of an ipykernel launched as ours are (the running interpreter) but with nothing of
    ours in it: no sandbox, no runtime."""
    km = _Manager(Box(Launch.of(SandboxConfig(mode="full-access"))))
    kc = None
    try:
        await km.start_kernel()
        kc = _open_client(km)
        await _handshake(km, kc, 60)
        yield kc
    finally:
        await _stop((km, kc), wait=5)


async def sandbox_figures(n_starts: int, n_cells: int) -> dict[str, float]:
    """Session start (kernel start to ready, bootstrap included) and cell round trip, sandboxed (with
    and without the seccomp filter) and not, the three interleaved."""
    configs = {"workspace-write": SandboxConfig(), "no-seccomp": SandboxConfig(seccomp=False),
               "full-access": SandboxConfig(mode="full-access")}
    starts: dict[str, list[float]] = {mode: [] for mode in configs}
    cells: dict[str, list[float]] = {mode: [] for mode in configs}
    views: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, home_in(Path(tmp) / "home"):
        work = Path(tmp) / "work"
        work.mkdir()
        for i in range(n_starts):
            for mode in list(starts)[i % 3:] + list(starts)[:i % 3]:
                s = Session(Config(sandbox=configs[mode]), ScriptedModel([]), cwd=work)
                t = time.perf_counter()
                await s.start()
                starts[mode].append(time.perf_counter() - t)
                if mode == "workspace-write":
                    t = time.perf_counter()
                    await s.kernel._confine()  # again: what applying the view costs on its own
                    views.append(time.perf_counter() - t)
                for j in range(n_cells + 20):
                    t = time.perf_counter()
                    await s.kernel.execute(Cell(id="c", code="1+1"))
                    if j >= 20:
                        cells[mode].append(time.perf_counter() - t)
                await s.close()
    med = {mode: statistics.median(xs) for mode, xs in starts.items()}
    cell = {mode: pct(xs, 0.5) for mode, xs in cells.items()}
    return {
        "start_sandboxed_s": med["workspace-write"], "start_unsandboxed_s": med["full-access"],
        "sandbox_start_overhead_ms": (med["workspace-write"] - med["full-access"]) * 1e3,
        "sandbox_view_ms": statistics.median(views) * 1e3,
        "cell_sandboxed_p50_ms": cell["workspace-write"] * 1e3, "cell_unsandboxed_p50_ms": cell["full-access"] * 1e3,
        "sandbox_cell_overhead_ms": (cell["workspace-write"] - cell["full-access"]) * 1e3,
        "start_no_seccomp_s": med["no-seccomp"], "cell_no_seccomp_p50_ms": cell["no-seccomp"] * 1e3,
        "seccomp_start_overhead_ms": (med["workspace-write"] - med["no-seccomp"]) * 1e3,
        "seccomp_cell_overhead_ms": (cell["workspace-write"] - cell["no-seccomp"]) * 1e3,
    }


def cells_then_answer(n: int):
    def script(request: dict) -> Reply:
        calls = sum(1 for m in request["messages"] if m["role"] == "assistant")
        return Reply(code=[str(calls)]) if calls < n else Reply(content="done")  # each its own: budget.max_repeats

    return script


def proc_kb(pid: int, file: str, field: str) -> int:
    """A figure in kB from a process's /proc file ("status", "VmHWM:"); 0 where it is gone or says none."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kb(pid: int) -> int:
    return proc_kb(pid, "smaps_rollup", "Pss:")


def descendants(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            out += [k, *descendants(k)]
    return out


def run_cli(n_cells: int, workdir: Path, measure_memory: bool = False) -> tuple[float, float]:
    """Wall seconds of `prime-agent run` with n cells; with `measure_memory`, its one cell waits 3 s
    and the PSS of the CLI process and its kernel, in MB, is sampled once that cell runs (a marker file
    says so: on a loaded machine, a fixed delay sampled a session not yet whole)."""
    script = cells_then_answer(n_cells)
    marker = workdir / "cell-running"
    marker.unlink(missing_ok=True)
    if measure_memory:
        code = f"open({str(marker)!r}, 'w').close(); import time; time.sleep(3)"
        script = lambda request: Reply(code=[code]) if len(request["messages"]) < 3 else Reply(content="done")  # noqa: E731
    with OpenAIServer(script) as server:
        env = dict(os.environ, OPENAI_BASE_URL=server.base_url, PRIME_AGENT_MODEL="bench",
                   PRIME_AGENT_HOME=str(workdir / "home"))
        t = time.perf_counter()
        p = subprocess.Popen([PRIME_AGENT, "run", "--max-turns", "1000", "bench"], cwd=workdir, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mem = 0.0
        if measure_memory:
            while not marker.exists() and p.poll() is None:
                time.sleep(0.02)
            mem = sum(pss_kb(pid) for pid in [p.pid, *descendants(p.pid)]) / 1024
        rc = p.wait(timeout=300)
        wall = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"prime-agent run failed with exit code {rc}")
    return wall, mem


async def system_figures(n_cells: int, repeats: int, floor_cells: int = 200) -> dict[str, float]:
    """`prime-agent run` with 1 and with n+1 cells, interleaved (the order alternating), and the floor
    measured between the pairs; one more cell is the median over the pairs of (n+1-cell - 1-cell) / n."""
    one: list[float] = []
    many: list[float] = []
    floor: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, home_in(Path(tmp) / "bare-home"):
        work = Path(tmp)
        async with bare_kernel() as kc:
            await round_trips(kc, 50)  # warm-up
            for i in range(repeats):
                for n in (1, n_cells + 1) if i % 2 == 0 else (n_cells + 1, 1):
                    (one if n == 1 else many).append(run_cli(n, work)[0])
                floor += await round_trips(kc, floor_cells)
        _, mem = run_cli(1, work, measure_memory=True)
    per_cell = statistics.median((m - o) / n_cells for o, m in zip(one, many)) * 1e3
    floor_ms = pct(floor, 0.5) * 1e3
    return {
        "run_1_cell_s": statistics.median(one),
        f"run_{n_cells + 1}_cells_s": statistics.median(many),
        "per_cell_ms": per_cell,
        "floor_round_trip_p50_ms": floor_ms,
        "per_cell_over_floor": per_cell / floor_ms,
        "session_pss_mb": mem,
    }


TARGETS = {
    "kernel_start_s": ("kernel start to ready (s)", None),
    "kernel_shutdown_s": ("kernel shutdown (s)", None),
    "start_sandboxed_s": ("session kernel start, sandboxed (s)", None),
    "start_unsandboxed_s": ("session kernel start, full-access (s)", None),
    "sandbox_start_overhead_ms": ("sandbox's cost on a kernel start (ms)", 20.0),
    "sandbox_view_ms": ("applying a session's view (ms)", None),
    "cell_sandboxed_p50_ms": ("cell round trip p50, sandboxed (ms)", None),
    "cell_unsandboxed_p50_ms": ("cell round trip p50, full-access (ms)", None),
    "sandbox_cell_overhead_ms": ("sandbox's cost on a cell p50 (ms)", 0.5),
    "start_no_seccomp_s": ("session kernel start, sandboxed without seccomp (s)", None),
    "cell_no_seccomp_p50_ms": ("cell round trip p50, sandboxed without seccomp (ms)", None),
    "seccomp_start_overhead_ms": ("seccomp filter's cost on a kernel start (ms)", None),
    "seccomp_cell_overhead_ms": ("seccomp filter's cost on a cell p50 (ms)", None),
    "cell_p50_ms": ("runtime cell round trip p50 (ms)", 5.0),
    "cell_p99_ms": ("runtime cell round trip p99 (ms)", None),
    "raw_jupyter_client_p50_ms": ("bare jupyter_client round trip p50 (ms)", None),
    "host_call_p50_ms": ("host-bridge call p50 from a cell (ms)", 0.5),
    "host_call_p99_ms": ("host-bridge call p99 from a cell (ms)", None),
    "output_1mb_ms": ("cell printing 1 MB (ms)", None),
    "per_cell_ms": ("whole system: one more cell (ms)", 9.0),
    "floor_round_trip_p50_ms": ("beside it: bare jupyter_client round trip p50 (ms)", None),
    "per_cell_over_floor": ("one more cell / the floor (x)", None),
    "run_1_cell_s": ("prime-agent run, 1 cell, wall (s)", 2.0),
    "session_pss_mb": ("session memory, PSS (MB)", 150.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=60, help="extra cells in the long run")
    ap.add_argument("--repeats", type=int, default=4, help="pairs of `prime-agent run` (1 cell, cells + 1)")
    ap.add_argument("--starts", type=int, default=12, help="session starts of each sandbox mode")
    ap.add_argument("--only-sandbox", action="store_true", help="the sandbox's figures alone")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "kernel.json"))
    args = ap.parse_args()

    load = load_average()
    figures = {} if args.only_sandbox else asyncio.run(runtime_figures(n_cells=500, n_starts=5))
    figures.update(asyncio.run(sandbox_figures(n_starts=args.starts, n_cells=200)))
    if not args.only_sandbox:
        figures.update(asyncio.run(system_figures(args.cells, args.repeats)))

    print(f"{'measure':<42} {'value':>10} {'target':>8}")
    for key, value in figures.items():
        label, target = TARGETS.get(key, (key, None))
        mark = "" if target is None else ("ok" if value <= target else "MISS")
        print(f"{label:<42} {value:>10.3f} {('<= %g' % target) if target else '':>8} {mark}")
    save(args.out, {"figures": figures, "cells": args.cells, "repeats": args.repeats}, load)


if __name__ == "__main__":
    main()
