"""Checkpoint and rewind benchmark: prints a table and writes bench/results/rewind.json.

    .venv/bin/python bench/rewind.py [--files 2000] [--mb 50] [--changed 5] [--turns 100]

A workspace of FILES text files (MB in all); for TURNS turns, CHANGED files are edited, then the
turn-boundary checkpoint is taken as a session takes it (`Checkpoints.at_turn_start`: the workspace
tree in the shadow store, each harness scope's commit, the record). Reported: the first checkpoint
(everything hashed once), the per-turn cost after it, the store's growth on disk per turn against
the bytes the turn changed (dedup: only what changed is stored), rewinds of 1 and of TURNS/2 turns
of files, and the kernel's namespace snapshot (what the turn boundary waits for: the fork; and the
background time until the snapshot is written). A bare `git --version` is the floor: one git
process on this machine, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.kernel.bridge import BridgeServer  # noqa: E402
from agent.checkpoints import Checkpoints  # noqa: E402
from agent.config_models import CheckpointConfig, KernelConfig, SandboxConfig  # noqa: E402
from agent.context import Context, Sinks  # noqa: E402
from agent.harness import SessionHarness, scope_roots  # noqa: E402
from agent.kernel import Kernel  # noqa: E402
from agent.kernel.view import View  # noqa: E402
from agent.layout import SessionLayout  # noqa: E402
from agent.kernel.runtime import ENV_PATH, ENV_TOKEN  # noqa: E402
from agent.trajectory import CheckpointRecord  # noqa: E402
from agent.types import Cell  # noqa: E402
from bench.report import load_average, save  # noqa: E402

WORDS = ("def class return import self value result index items print error path config open with "
         "for while if else try except raise lambda yield async await None True False").split()


def source_text(rng: random.Random, size: int) -> str:
    """Text that compresses like source code does (not like zeros, not like noise)."""
    lines, n = [], 0
    while n < size:
        line = "    " * rng.randrange(4) + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 12)))
        line += f"  # {rng.getrandbits(64):x}\n"
        lines.append(line)
        n += len(line)
    return "".join(lines)[:size]


def make_workspace(root: Path, files: int, total_mb: int, rng: random.Random) -> list[Path]:
    size = total_mb * (1 << 20) // files
    paths = []
    for i in range(files):
        path = root / f"pkg{i % 50}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source_text(rng, size))
        paths.append(path)
    return paths


def ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": statistics.median(xs) * 1e3, "p95": xs[int(len(xs) * 0.95) - 1] * 1e3, "max": xs[-1] * 1e3}


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        os.environ["PRIME_AGENT_HOME"] = str(home)
        ws = Path(tmp) / "ws"
        paths = make_workspace(ws, args.files, args.mb, rng)
        layout = SessionLayout(home / "sessions" / "bench")
        layout.dir.mkdir(parents=True)
        records: list = []
        sinks = Sinks(emit=lambda e: None, record=records.append, charge=lambda u, p: None, turn_id=lambda: None)
        harness = SessionHarness(scope_roots(home, ws, layout.dir), "bench")
        sandbox = SandboxConfig()
        view = View.of(sandbox, ws, layout.dir, [s.root for s in harness.stores.values()], ws)
        kernel = Kernel(ws, KernelConfig(), env={}, sandbox=sandbox, view=view)  # confined as a session's
        cp = Checkpoints(CheckpointConfig(), ws, layout, "bench", kernel, harness, Context(records.append), sinks)
        store = cp.store
        assert store is not None

        floor = []
        for _ in range(20):
            t = time.perf_counter()
            subprocess.run(["git", "--version"], capture_output=True)
            floor.append(time.perf_counter() - t)

        t = time.perf_counter()
        await cp.at_turn_start("t0")
        first = time.perf_counter() - t
        after_first = store.disk_bytes()

        boundary, growth, changed_bytes, trees = [], [], [], []
        for turn in range(1, args.turns + 1):
            changed = 0
            for path in rng.sample(paths, args.changed):  # the turn edits CHANGED files
                text = path.read_text()
                at = rng.randrange(len(text))
                new = text[:at] + source_text(rng, 200) + text[at + 200:]
                path.write_text(new)
                changed += len(new)
            before = store.disk_bytes() if turn % 10 == 0 or turn == 1 else None
            t = time.perf_counter()
            await cp.at_turn_start(f"t{turn}")
            boundary.append(time.perf_counter() - t)
            trees.append(records[-1].tree)
            if before is not None:
                growth.append(store.disk_bytes() - before)
                changed_bytes.append(changed)
        grown = store.disk_bytes() - after_first

        def rewind_to(tree: str) -> float:
            t = time.perf_counter()
            now = store.snapshot()
            store.restore(now.tree, tree, set())
            store.snapshot()  # the rewind's own checkpoint after it
            return time.perf_counter() - t

        one = [rewind_to(trees[-2]), rewind_to(trees[-1])]
        many = [rewind_to(trees[len(trees) // 2]), rewind_to(trees[-1])]
        files_many = len(store.changed_paths(trees[len(trees) // 2], trees[-1]))

        kernel_fork, kernel_written = [], []
        bridge = BridgeServer(layout.dir, {})
        await bridge.start()
        kernel.env = {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}
        layout.kernel_snapshots.mkdir(parents=True, exist_ok=True)  # bound writable into the sandbox, as a session does
        await kernel.start()
        try:
            await kernel.execute(Cell(id="setup", code=(
                "data = {i: list(range(1000)) for i in range(400)}\ntext = 'x' * 20_000_000\n"
                "import json, os\nrows = [dict(a=i, b=str(i)) for i in range(100_000)]")))
            for _ in range(5):
                t = time.perf_counter()
                name = await cp._snapshot_kernel()
                kernel_fork.append(time.perf_counter() - t)
                manifest = layout.kernel_snapshots / f"{name}.json"
                while not manifest.exists():
                    await asyncio.sleep(0.005)
                kernel_written.append(time.perf_counter() - t)
            namespace_bytes = json.loads(manifest.read_text())["bytes"]
        finally:
            await kernel.shutdown()
            await bridge.close()
        kernel_disk = sum(p.stat().st_size for p in layout.kernel_snapshots.rglob("*") if p.is_file())
        assert all(isinstance(r, CheckpointRecord) for r in records)

    return {
        "workspace": {"files": args.files, "mb": args.mb, "changed_per_turn": args.changed, "turns": args.turns},
        "git_process_floor_ms": ms(floor),
        "first_checkpoint_ms": first * 1e3,
        "store_after_first_mb": after_first / 2**20,
        "turn_boundary_ms": ms(boundary),
        "growth_per_turn_kb": statistics.median(growth) / 1024,
        "changed_per_turn_kb": statistics.median(changed_bytes) / 1024,
        "growth_over_turns_mb": grown / 2**20,
        "rewind_1_turn_ms": ms(one),
        "rewind_half_ms": ms(many),
        "rewind_half_files": files_many,
        "kernel_snapshot_boundary_ms": ms(kernel_fork),
        "kernel_snapshot_written_ms": ms(kernel_written),
        "kernel_namespace_mb": namespace_bytes / 2**20,
        "kernel_snapshots_disk_mb": kernel_disk / 2**20,
        "nproc": os.cpu_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--changed", type=int, default=5)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rewind.json"))
    args = ap.parse_args()
    load = load_average()
    r = asyncio.run(run(args))
    w = r["workspace"]
    print(f"workspace: {w['files']} files, {w['mb']} MB; {w['changed_per_turn']} files changed a turn, "
          f"{w['turns']} turns; {r['nproc']} CPUs")
    rows = [
        ("one git process (floor)", f"{r['git_process_floor_ms']['p50']:.1f} ms", ""),
        ("first checkpoint (all hashed)", f"{r['first_checkpoint_ms']:.0f} ms",
         f"store {r['store_after_first_mb']:.1f} MB"),
        ("turn-boundary checkpoint", f"{r['turn_boundary_ms']['p50']:.1f} ms",
         f"p95 {r['turn_boundary_ms']['p95']:.1f}, max {r['turn_boundary_ms']['max']:.1f} ms"),
        ("store growth per turn", f"{r['growth_per_turn_kb']:.0f} KB",
         f"files changed: {r['changed_per_turn_kb']:.0f} KB; {r['growth_over_turns_mb']:.1f} MB over "
         f"{w['turns']} turns"),
        ("rewind 1 turn (files)", f"{r['rewind_1_turn_ms']['p50']:.0f} ms", f"{w['changed_per_turn']} files"),
        ("rewind half the turns", f"{r['rewind_half_ms']['p50']:.0f} ms", f"{r['rewind_half_files']} files"),
        ("namespace snapshot, turn waits", f"{r['kernel_snapshot_boundary_ms']['p50']:.1f} ms",
         f"{r['kernel_namespace_mb']:.0f} MB namespace (fork, then the child pickles)"),
        ("namespace snapshot written", f"{r['kernel_snapshot_written_ms']['p50']:.0f} ms",
         f"in the background; 5 snapshots take {r['kernel_snapshots_disk_mb']:.0f} MB (dedup by variable)"),
    ]
    for name, value, note in rows:
        print(f"{name:<32} {value:>10}   {note}")
    save(args.out, r, load)


if __name__ == "__main__":
    main()
