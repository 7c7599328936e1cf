"""FSDP2 on a Hugging Face model: the tiny random-init llama of tests/rl/conftest.py, warm-started, trains
under torchrun with two processes (gloo, CPU) as one process does, full weights and a LoRA adapter; each
checkpoint stays what plain transformers and peft load, and resumes at either process count; two torchrun
"nodes" rendezvous over c10d on 127.0.0.1 and train to the end. The same first step on SmolLM2 with LoRA."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rl.config import load
from rl.hf import HFPolicy, load_hf
from rl.train import sft, train
from tests.rl.distributed import ROOT, command, environment, metrics, same_steps, torchrun

pytestmark = pytest.mark.timeout(900)  # torchrun's processes each import torch and transformers: slow on 2 loaded cores

LORA = ["--model.lora", "{r = 4, alpha = 8}"]


def overrides(model: Path, steps: int, *extra: str) -> list[str]:
    """Reverse-text on `model`: two groups of four rollouts a step, a checkpoint after every step."""
    return ["--model.hf", json.dumps(str(model)), "--env.name", '"reverse_text"',
            "--env.options", "{min_len = 3, max_len = 4}", "--sft.steps", "0", "--train.steps", str(steps),
            "--train.batch_size", "2", "--train.group_size", "4", "--train.max_tokens", "6", "--train.lr", "1e-3",
            "--train.checkpoint_every", "1", "--train.threads", "1", *extra]


@pytest.fixture(scope="module")
def warm(tiny_llama: Path, tmp_path_factory) -> Path:
    """The tiny llama after a short warm start: it reverses some of the text, so groups' rewards differ."""
    out = tmp_path_factory.mktemp("warm")
    cfg = load(None, [*overrides(tiny_llama, 0), "--sft.steps", "40", "--sft.batch_size", "16", "--sft.lr", "3e-3",
                      "--train.out", json.dumps(str(out))])
    return sft(cfg, log=lambda *_: None)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """An empty config file: the runs are set by their overrides (torchrun's rl.train takes a file)."""
    path = tmp_path_factory.mktemp("config") / "config.toml"
    path.write_text("")
    return path


def one_process(out: Path, args: list[str]) -> list[dict]:
    train(load(None, [*args, "--train.out", json.dumps(str(out))]), log=lambda *_: None, progress=False)
    return metrics(out)


def plain(checkpoint: Path, base: Path, lora: bool) -> dict[str, torch.Tensor]:
    """The weights plain transformers loads from a checkpoint (with peft, an adapter on its `base`)."""
    model = AutoModelForCausalLM.from_pretrained(base if lora else checkpoint, local_files_only=True)
    return (PeftModel.from_pretrained(model, checkpoint) if lora else model).state_dict()


def resumed_from(checkpoint: Path, out: Path) -> Path:
    """`out`, a run directory holding a copy of `checkpoint` (another run's) to resume from."""
    shutil.copytree(checkpoint, out / "checkpoints" / checkpoint.name)
    return out


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["full", "lora"])
def test_two_processes_go_on_from_a_one_process_checkpoint_taking_its_steps_and_their_checkpoint_resumes_in_one(
        warm: Path, config: Path, tmp_path: Path, lora: bool):
    """Across process counts both ways with one torchrun (~20 s of CPU: each of its processes imports torch and
    transformers). Two processes from the start: the two nodes' test (full weights) and SmolLM2's (LoRA)."""
    args = overrides(warm, 4, *(LORA if lora else []))
    one = one_process(tmp_path / "one", args)
    # steps that train: the first (the checkpoint two processes resume holds Adam's state), the second (theirs:
    # its losses are not zeros) and the last (one process resuming their checkpoint); with LoRA, no group of
    # the third has signal: it trains nothing
    assert all(one[step]["samples"] > 0 for step in (0, 1, 3))
    two = torchrun(config, resumed_from(tmp_path / "one" / "checkpoints" / "step-1", tmp_path / "two"), *args)
    same_steps(two, one[1:])

    # the two-process checkpoints are what one process writes, with the trained shards beside them; the
    # second one written is from a gather of the trained weights alone (rl.dist.gathered keeps the frozen)
    for step in ("step-2", "step-3"):
        checkpoint = tmp_path / "two" / "checkpoints" / step
        assert (checkpoint / "dcp" / ".metadata").is_file()
        for (name, a), b in zip(plain(checkpoint, warm, lora).items(),
                                plain(tmp_path / "one" / "checkpoints" / step, warm, lora).values(), strict=True):
            # Adam divides by the gradient's own size: where a gradient is near 0, the rounding of its two-process
            # sum moves that weight by up to ~lr (1e-3); a wrong step moves every weight by about lr
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{step} {name}")
    checkpoint = tmp_path / "two" / "checkpoints" / "step-3"
    same_steps(one_process(resumed_from(checkpoint, tmp_path / "resumed"), args), two[2:])


@pytest.mark.slow
def test_two_nodes_rendezvous_over_c10d_and_train_to_the_end(warm: Path, config: Path, tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = ("--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                f"127.0.0.1:{port}", "--rdzv_id", "two-nodes")
    out = tmp_path / "run"
    nodes = []
    for i in range(2):  # logs to files: node 1's pipe, read only after node 0 ended, would stall them both
        with open(tmp_path / f"node-{i}.log", "w") as log:
            nodes.append(subprocess.Popen(command(config, out, *overrides(warm, 2), launcher=launcher), cwd=ROOT,
                                          env=environment(out), stdout=log, stderr=subprocess.STDOUT, text=True))
    try:
        for node in nodes:
            node.wait(timeout=600)
    finally:
        for node in nodes:
            node.kill()
    logs = [(tmp_path / f"node-{i}.log").read_text() for i in range(2)]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    same_steps(metrics(out), one_process(tmp_path / "one", overrides(warm, 2)))
    assert (out / "checkpoints" / "step-2" / "dcp" / ".metadata").is_file()
    assert (out / "checkpoints" / "step-2" / "model.safetensors").is_file()


@pytest.mark.slow
def test_smollm2_with_a_lora_adapter_takes_the_same_first_step_in_two_processes(smollm2: Path, config: Path,
                                                                                tmp_path: Path):
    args = overrides(smollm2, 1, "--model.lora", "{r = 8, alpha = 16, layers = 2}")
    one = one_process(tmp_path / "one", args)
    assert one[0]["samples"] > 0
    same_steps(one, torchrun(config, tmp_path / "two", *args))


def test_a_model_without_decoder_blocks_where_fsdp2_looks_is_refused_by_name(tiny_llama: Path):
    from transformers import GPT2Config

    gpt2 = HFPolicy(AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)))
    with pytest.raises(ValueError, match="GPT2LMHeadModel: no decoder blocks at `model.layers`"):
        list(gpt2.blocks)
    assert len(load_hf(tiny_llama).blocks) == 2
