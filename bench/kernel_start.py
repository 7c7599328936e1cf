"""What a kernel's start costs, in the kernel's own CPU seconds (on a loaded machine wall time says little):
manager.LAUNCH against the same launch with ipykernel's debugger (debugpy and pydevd imported), interleaved.

    .venv/bin/python bench/kernel_start.py [--starts 8]

Each start: launch, answer kernel_info, import the runtime (a session's bootstrap); then the kernel's CPU
(user + system, from /proc) and the wall time to that point. Unsandboxed: the sandbox's own cost is
bench/kernel.py's. Writes bench/results/kernel_start.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_client import AsyncKernelManager  # noqa: E402
from jupyter_client.kernelspec import KernelSpec  # noqa: E402

from agent.kernel.manager import KERNEL_ARGS, LAUNCH  # noqa: E402
from bench.report import load_average, save  # noqa: E402

NO_DEBUGGER = ('sys.modules["debugpy"] = None', 'del sys.modules["debugpy"]')
WITH_DEBUGGER = "\n".join(line for line in LAUNCH.splitlines() if not any(s in line for s in NO_DEBUGGER))
assert WITH_DEBUGGER.count("\n") == LAUNCH.count("\n") - 2, "manager.LAUNCH no longer blocks debugpy as this expects"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def start(code: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one kernel, from launch to its runtime imported."""

    class Manager(AsyncKernelManager):
        @property
        def kernel_spec(self) -> KernelSpec:
            return KernelSpec(argv=[sys.executable, "-c", code, "-f", "{connection_file}", *KERNEL_ARGS],
                              display_name="bench", language="python")

    km = Manager(transport="ipc")
    t = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        msg_id = kc.execute("import agent.kernel.runtime", silent=True)
        while (await kc.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
            pass
        wall = time.perf_counter() - t
        return cpu_seconds(km.provisioner.process.pid), wall
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def main(starts: int) -> None:
    started = load_average()
    figures: dict[str, list[tuple[float, float]]] = {"manager.LAUNCH": [], "with the debugger": []}
    for _ in range(starts):
        figures["manager.LAUNCH"].append(await start(LAUNCH))
        figures["with the debugger"].append(await start(WITH_DEBUGGER))
    medians = {name: {"kernel_cpu_s": statistics.median(c for c, _ in runs),
                      "wall_to_ready_s": statistics.median(w for _, w in runs)} for name, runs in figures.items()}
    print(f"{starts} starts each, interleaved; medians")
    print(f"{'launch':<20} {'kernel CPU (s)':>15} {'wall to ready (s)':>18}")
    for name, m in medians.items():
        print(f"{name:<20} {m['kernel_cpu_s']:>15.3f} {m['wall_to_ready_s']:>18.3f}")
    save(ROOT / "bench" / "results" / "kernel_start.json", {"starts": starts, "medians": medians}, started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=8)
    asyncio.run(main(parser.parse_args().starts))
