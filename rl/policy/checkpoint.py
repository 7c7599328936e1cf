"""Checkpoints: the weights (safetensors) and config of a policy, the optimizer and RNG state beside them,
and a marker written last, so a directory without it is unfinished and ignored."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
import torch.nn as nn

from rl.policy.policy import Policy

MARKER = "COMPLETE"
"""Written last: a checkpoint directory without it is unfinished and ignored."""


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, step: int,
                    extra: dict | None = None) -> None:
    """`model` (a byte `Policy` or an rl.hf.HFPolicy: its own `save`), the optimizer's and torch's RNG state and
    `extra` into `path`, written in a folder beside it and moved into place whole, the marker in it last."""
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    state = {"step": step, "rng": torch.get_rng_state(), **(extra or {})}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    torch.save(state, tmp / "trainer.pt")
    (tmp / MARKER).write_text(str(step))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def load_policy(path: Path) -> nn.Module:
    """A checkpoint's model: a byte `Policy`, or a Hugging Face model (rl.hf.HFPolicy) where the checkpoint
    is a model directory or a LoRA adapter."""
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    if (path / "adapter_config.json").is_file() or "model_type" in (path / "config.json").read_text():
        from rl.hf import load_hf

        return load_hf(path)
    return Policy.load(path)


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / "trainer.pt", weights_only=False)


def latest_checkpoint(root: Path) -> Path | None:
    done = [p for p in root.glob("step-*") if re.fullmatch(r"step-\d+", p.name) and (p / MARKER).is_file()] \
        if root.is_dir() else []
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)
