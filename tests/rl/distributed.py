"""Runs under torchrun for the data-parallel tests, and what they compare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


STANDALONE = ("--standalone", "--nproc_per_node", "2")
"""Two processes on this machine."""


def torchrun(config: Path | str, out: Path, *overrides: str, launcher: tuple[str, ...] = STANDALONE) -> list[dict]:
    """A run under torchrun (rl.train); its metrics rows."""
    run = subprocess.run(command(config, out, *overrides, launcher=launcher), cwd=ROOT, env=environment(out),
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return metrics(out)


def command(config: Path | str, out: Path, *overrides: str, launcher: tuple[str, ...] = STANDALONE) -> list[str]:
    """`torchrun LAUNCHER -m rl.train CONFIG OVERRIDES --train.out OUT`."""
    return [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "rl.train", str(config), *overrides,
            "--train.out", json.dumps(str(out))]


def environment(out: Path) -> dict[str, str]:
    """The run's environment, its temporary folders beside `out`: torchrun leaves its own (torchelastic_*) behind."""
    tmp = out.parent / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, TMPDIR=str(tmp))


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def same_steps(a: list[dict], b: list[dict]) -> None:
    """The same rollouts (rewards exactly: rank 0 samples with the seeds one process uses) and the same
    update up to the order of float additions across ranks."""
    assert [h["step"] for h in a] == [h["step"] for h in b]
    assert [h["reward_mean"] for h in a] == [h["reward_mean"] for h in b]
    for x, y in zip(a, b):
        assert (x["samples"], x["tokens"]) == (y["samples"], y["tokens"])
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6)
        if x["samples"]:  # a step where no group has signal trains nothing: no gradient, no entropy
            assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
            assert x["entropy"] == pytest.approx(y["entropy"], rel=1e-5)
