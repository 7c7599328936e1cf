"""`prime-agent demo` in miniature, as a user runs it: a real daemon process, the policy server,
agent sessions with real kernels, IPO steps on their trajectories, and the before/after report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.trajectory import read_records
from rl.data import samples

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # two demo runs, each allowed 300 s
PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")
MINIATURE = [  # one task kind, a tiny policy: the warm start learns its one cell in a few steps
    "--eval-tasks", "4", "--eval-rollouts", "2", "--concurrency", "4",
    "--model.d_model", "64", "--model.n_layer", "2", "--model.n_head", "2",
    "--env.options", '{kinds = ["lines"]}', "--sft.steps", "120", "--sft.batch_size", "16", "--sft.lr", "3e-3",
    "--train.batch_size", "2", "--train.group_size", "4",
]


def demo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """As the README's first command runs it: `.venv/bin/prime-agent demo`, the venv not on PATH."""
    bin_dir = str(Path(PRIME_AGENT).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir)
    return subprocess.run([PRIME_AGENT, "demo", *args, *MINIATURE], cwd=cwd, text=True, capture_output=True,
                          timeout=300, env={**os.environ, "PATH": path})


def test_the_demo_trains_the_policy_on_its_own_daemon_sessions(tmp_path: Path, prime_home: Path):
    try:
        first = demo("--steps", "3", cwd=tmp_path)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "before and after RL" in first.stdout
        assert f"{PRIME_AGENT} --resume" in first.stdout  # named as it was run: setup puts nothing on PATH
        (run,) = (prime_home / "demo" / "runs").iterdir()
        results = json.loads((run / "results.json").read_text())
        assert [h["step"] for h in results["history"]] == [0, 1, 2]
        for side in ("before", "after"):
            assert results[side]["errors"] == 0 and results[side]["reward"]["n"] == 4
        assert (run / "reward.png").stat().st_size > 0
        assert len(list((run / "checkpoints").glob("step-3"))) == 1

        rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
        assert [r["label"] for r in rollouts].count("train") == 3 * 2 * 4
        assert all(r["outcome"] in ("passed", "failed") for r in rollouts)
        # the trainer learned from the sessions' own tokens: every reply came with its logprobs
        assert sum(h["samples"] for h in results["history"]) > 0
        assert all(h["replies_without_logprobs"] == 0 for h in results["history"])
        # issue 52: the demo left its daemon running and every session (587 MB of home for the full run).
        # Now two stay, the first task before and after RL; the rest went with their files, and so did
        # the daemon the demo started.
        assert "stopped the daemon the demo started" in first.stdout
        kept = [results["before"]["kept"], results["after"]["kept"]]
        assert sorted(d.name for d in (prime_home / "sessions").iterdir()) == sorted(kept)
        assert not (prime_home / "checkpoints").exists()  # nobody rewinds a rollout: none were taken
        after = next(r for r in rollouts if r["session"] == kept[1])
        (sample,) = samples(read_records(prime_home / "sessions" / kept[1] / "trajectory.jsonl"))
        assert 0 < sum(sample.mask) == after["completion_tokens"]  # a session's own tokens, with their logprobs
        listed = subprocess.run([PRIME_AGENT, "sessions", "--json"], text=True, capture_output=True, timeout=60)
        sessions = json.loads(listed.stdout)
        assert {s["id"] for s in sessions} == set(kept) and {s["state"] for s in sessions} == {"dormant"}

        again = demo("--steps", "1", cwd=tmp_path)  # a second run reuses the warm start
        assert again.returncode == 0, again.stdout + again.stderr
        assert "warm start: reusing" in " ".join(again.stdout.split())
    finally:
        subprocess.run([PRIME_AGENT, "daemon", "stop"], capture_output=True, timeout=60)
