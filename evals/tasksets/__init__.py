"""Task sets by name (built-ins), by path (a JSONL file of tasks, or a Python module), or from the
ecosystem's packages: `rg:DATASET[?key=value&...]` (reasoning-gym) and `vf:TASKSET_ID[?key=value&...]`
(a verifiers taskset)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from agent.config_models import SandboxConfig
from evals.env import Check, Environment, MissingPackage, Task, pick
from evals.scoring import Scratch

BUILTINS = ("reverse_text", "kernel_tasks", "repo_fix")
PACKAGED = ("rg", "vf")
"""Prefixes of task sets that come from another package: reasoning-gym and verifiers."""


def parse_spec(spec: str, label: str | None = None) -> tuple[str, dict[str, Any]]:
    """`NAME?key=value&...` as (NAME, options): each value read as a JSON literal where it is one
    (`3`, `0.5`, `true`, `[1, 2]`), else kept as text. `label` names the task set in errors."""
    label = label or spec
    name, _, query = spec.partition("?")
    options: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError:
        raise ValueError(f"task set {label!r}: the options after '?' are not key=value pairs joined by '&'") from None
    for key, value in pairs:
        if key in options:
            raise ValueError(f"task set {label!r}: option {key!r} is given twice")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return name, options


def load_taskset(spec: str, scoring_sandbox: SandboxConfig | None = None, **options: Any) -> Environment:
    """The task set `spec` names; `options` (an RL config's `[env] options`) add to those of its query.
    `scoring_sandbox`: the sandbox settings its scorers' boxes follow (evals.scoring; default: the
    defaults). A .py module's `environment` is its own, made before."""
    prefix, colon, rest = spec.partition(":")
    if colon and prefix in PACKAGED:
        name, query = parse_spec(rest, spec)
        if prefix == "rg":
            from evals.tasksets.reasoning_gym import ReasoningGym

            return ReasoningGym(name, {**query, **options}, spec=spec)
        from evals.tasksets.verifiers import VerifiersTaskset

        return VerifiersTaskset(name, {**query, **options}, spec=spec, sandbox=scoring_sandbox)
    if options:
        raise ValueError(f"task set {spec!r} takes no options")
    if spec == "reverse_text":
        from evals.tasksets.reverse_text import ReverseText

        return ReverseText()
    if spec == "kernel_tasks":
        from evals.tasksets.kernel_tasks import KernelTasks

        return KernelTasks()
    if spec == "repo_fix":
        from evals.tasksets.repo_fix import RepoFix

        return RepoFix(scoring_sandbox)
    path = Path(spec)
    if path.suffix == ".jsonl" and path.is_file():
        return JsonlTasks(path, scoring_sandbox)
    if path.suffix == ".py" and path.is_file():
        module_spec = importlib.util.spec_from_file_location(f"taskset_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        if not hasattr(module, "environment"):
            raise ValueError(f"{path}: a task-set module must define `environment` (tasks(n, seed=...), check(...))")
        return module.environment
    raise ValueError(f"unknown task set {spec!r}: a built-in ({', '.join(BUILTINS)}), a .jsonl file, a .py module, "
                     "rg:DATASET (reasoning-gym) or vf:TASKSET_ID (verifiers)")


def select(spec: str, n: int | None, seed: int) -> list[Task]:
    """The tasks a configuration means: the same everywhere (eval, the refiner's gate, RL evaluation)."""
    return load_taskset(spec).tasks(n, seed=seed)


def task_key(task: Task, config: dict[str, Any]) -> str:
    """Identifies a rollout's task and configuration, for resuming."""
    blob = json.dumps({"id": task.id, "prompt": task.prompt, "files": task.files, "data": task.data, "config": config},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class JsonlTasks:
    """One task per line: {"id", "prompt", "files"?: {path: text}, "check": {"shell": cmd, "files"?: {path: text},
    "timeout"?: seconds} | {"python": expr}}. A shell check passes on exit 0, run on a copy of the workspace
    with the check's own `files` written over it, in a sandbox of its own (evals.scoring), and fails
    past its `timeout` (default 300 s); a Python expression over `answer` passes when truthy."""

    def __init__(self, path: Path, sandbox: SandboxConfig | None = None):
        self.name = path.stem
        self.sandbox = sandbox
        self.items = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                check = d.get("check", "True")
                if isinstance(check, dict) and not isinstance(check.get("files", {}), dict):
                    raise TypeError("check.files must map paths to text")
                if isinstance(check, dict) and not isinstance(check.get("timeout", 1), (int, float)):
                    raise TypeError("check.timeout must be a number of seconds")
                self.items.append(Task(id=str(d["id"]), prompt=d["prompt"], files=d.get("files", {}),
                                       data={"check": check}))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a task ({e})") from None
            if sum(t.id == self.items[-1].id for t in self.items) > 1:
                raise ValueError(f"{path}:{n}: task id {self.items[-1].id!r} is used twice")

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        return pick(self.items, n, seed)

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        check = task.data["check"]
        if isinstance(check, dict) and "shell" in check:
            timeout = float(check.get("timeout", 300))
            with Scratch(workspace, self.sandbox, restore=check.get("files", {})) as scratch:
                ran = asyncio.run(scratch.run(["/bin/sh", "-c", check["shell"]], timeout))
            said = f"ran past {timeout:g}s" if ran.timed_out else (ran.stdout + ran.stderr).strip()[-300:]
            return Check(ran.code == 0, float(ran.code == 0), scratch.note(said))
        expr = check["python"] if isinstance(check, dict) else str(check)
        try:
            ok = bool(eval(expr, {"answer": answer}))  # the task file is the user's own
        except Exception as e:
            return Check(False, 0.0, f"check raised {type(e).__name__}: {e}")
        return Check(ok, float(ok), expr)
