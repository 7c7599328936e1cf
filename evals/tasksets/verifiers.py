"""`vf:TASKSET_ID[?key=value&...]`: an installed verifiers (0.4) taskset, selected and scored by verifiers.

    vf:my_taskset                  the taskset verifiers' own loader finds for the id
    vf:my_taskset?split=test       with its config fields (the taskset's TasksetConfig, validated by it)

The id resolves as verifiers resolves it (`verifiers.v1.tasksets.<id>`, then the module `<id>`, whose
`__all__` exports the Taskset), and the query's fields validate against the taskset's own config type.
`tasks(n, seed)` is verifiers' `shuffle(seed).take(n)`, so a seed picks the tasks `vf-eval` picks. The
task's prompt and system prompt are the session's; its final answer becomes the last assistant message
of a trace (system, prompt, answer) that the task's own `@vf.reward` and `@vf.metric` functions score,
under the task's scoring timeout: the reward is the trace's weighted sum, passed means every reward gave
full marks, and the metrics go to results.jsonl. A scorer that raises fails the rollout with its error
kept; a scoring deadline that passes is `timed_out`, as verifiers records it, and so is a rollout that
runs past the task's agent timeout (`timeout.agent`, within the run's own). Resume keys come from the
task's verifiers key (its content hash, or the durable key it declares) and its position.

A task with files or tests runs against the session's workspace: verifiers' subprocess runtime rooted
there (`WorkspaceRuntime`) is the box its `setup` runs in before the session (`prepare`: the task's own
code on the task's own files). Its `finalize` and runtime-reading rewards run after the session on
what the policy left, so they get a runtime of their own (`ScoringRuntime`, docs/evals.md "Scorers run
confined"): a copy of the workspace (evals.scoring.Scratch), each command in a sandbox of its own with
the scrubbed environment (the task's own `env` scrubbed too), files read and written in the copy never
through a link, no live or background processes. Tasks that need a container (`NEEDS_CONTAINER`, an
image) are refused when dealt, saying so.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from agent.config_models import SandboxConfig
from evals.env import Check, MissingPackage, Task
from evals.scoring import Scratch

INSTALL = "pip install 'prime-agent[verifiers]' (in a clone: pip install -e '.[verifiers]')"


def verifiers_loaders():
    """verifiers' plugin loaders, or a MissingPackage naming the install command."""
    try:
        from verifiers.v1.utils import loaders
    except ImportError as e:
        if getattr(e, "name", "") and not str(e.name).startswith("verifiers"):
            raise  # verifiers is there but broken: its own error says more
        raise MissingPackage(f"vf: task sets need verifiers: {INSTALL}") from None
    return loaders


class VerifiersTaskset:
    def __init__(self, taskset_id: str, options: dict[str, Any], spec: str | None = None,
                 sandbox: SandboxConfig | None = None):
        loaders = verifiers_loaders()
        from pydantic import ValidationError

        self.name = spec or f"vf:{taskset_id}"
        self.sandbox = sandbox
        """The sandbox settings its scorers' boxes follow (evals.scoring)."""
        if not taskset_id:
            raise ValueError(f"{self.name}: name an installed verifiers taskset, e.g. vf:my_taskset")
        try:
            config_type = loaders.taskset_config_type(taskset_id)
            self.config = config_type.model_validate({**options, "id": taskset_id})
            self.taskset = loaders.load_taskset(self.config)
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ValueError(f"{self.name}: the taskset's config refused the options: {why}") from None
        except (ModuleNotFoundError, AttributeError, TypeError) as e:
            raise ValueError(f"{self.name}: {e}") from None
        self._dealt: dict[str, Any] = {}
        """Our task id -> the verifiers task it stands for (filled as tasks are dealt)."""
        self._prepared: dict[str, Any] = {}
        """A workspace -> the trace its task's setup began (scoring goes on with it)."""
        workspace_runtime(), scoring_runtime()  # imported now: never inside a task's deadline

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        """verifiers' `shuffle(seed).take(n)` (all of a bounded taskset without n)."""
        if n is not None and n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        view = self.taskset.shuffle(seed)  # raises for an infinite taskset, as verifiers does
        if n is not None:
            view = view.take(n)
        out = []
        for vt in view:
            refuse_runtime(self.name, vt)
            tid = str(vt.data.id) if vt.data.id is not None else f"{vt.data.idx}"
            self._dealt[tid] = vt
            out.append(Task(id=tid, prompt=vt.data.prompt_text, system=vt.data.system_prompt,
                            data={"key": vt.key, "idx": vt.data.idx}, timeout=vt.data.timeout.agent))
        ids = [t.id for t in out]
        if len(set(ids)) < len(ids):
            raise ValueError(f"{self.name}: two tasks share a TaskData.id")
        return out

    def _task(self, task: Task):
        vt = self._dealt.get(task.id)
        if vt is None or vt.key != task.data["key"]:
            vt = next((t for t in self.taskset if t.key == task.data["key"]), None)
            if vt is None:
                raise ValueError(f"{self.name}: no task with key {task.data['key']} (did the taskset change?)")
        return vt

    def prepare(self, task: Task, workspace: Path) -> None:
        """The task's `setup` in the rollout's workspace (under its setup timeout), before its session starts."""
        vt = self._task(task)
        trace = trace_of(vt)

        async def setup(runtime):
            try:
                async with asyncio.timeout(vt.data.timeout.setup):
                    await vt.setup(trace, runtime)
            except TimeoutError:
                trace.record_timeout("setup")
                raise TimeoutError(f"setup ran past the task's {vt.data.timeout.setup:g}s") from None

        asyncio.run(in_workspace(workspace, setup))
        self._prepared[str(workspace)] = trace

    def check(self, task: Task, answer: str, workspace: Path | None) -> Check:
        trace = self._prepared.pop(str(workspace), None) if workspace is not None else None
        if workspace is None:
            return asyncio.run(score(self._task(task), answer, None, trace))
        with Scratch(workspace, self.sandbox) as scratch:
            check = asyncio.run(score(self._task(task), answer, scratch, trace))
        check.detail = scratch.note(check.detail)
        return check

    def reward(self, task: Task, answer: str) -> float:
        return self.check(task, answer, None).reward


async def score(vt, answer: str, scratch: Scratch | None = None, trace=None) -> Check:
    """The task's own rewards and metrics on a trace whose last reply is `answer`, as verifiers scores a
    finished rollout: `finalize`, then `Task.score` under the task's scoring timeout, on the copy of the
    workspace `scratch` (without one, verifiers skips the signals that read the box)."""
    trace = reply(trace if trace is not None else trace_of(vt), answer)
    runtime = scoring_runtime()(scratch) if scratch is not None else None
    stage = "finalize"
    try:
        if runtime is not None:  # each stage under its own deadline, as verifiers runs them
            async with asyncio.timeout(vt.data.timeout.finalize):
                await vt.finalize(trace, runtime)
        stage = "scoring"
        async with asyncio.timeout(vt.data.timeout.scoring):
            await vt.score(trace, runtime)
    except TimeoutError:
        trace.record_timeout(stage)
        limit = getattr(vt.data.timeout, stage)
        raise TimeoutError(f"{stage} ran past the task's {limit:g}s") from None
    except Exception as e:  # verifiers' TaskError: the task's scorer (or finalize) raised
        return Check(False, 0.0, f"the task's {stage} raised", error=f"{type(e).__name__}: {e}")
    finally:
        if runtime is not None:
            await runtime.stop()
    rewards = {k: r for k, r in trace.rewards.items() if r is not None}
    metrics = {k: float(v) for k, v in trace.metrics.items() if v is not None}
    passed = bool(rewards) and all(r.score >= 1.0 for r in rewards.values())
    detail = ", ".join(f"{k}={r.score:.3f}" + (f"x{r.weight:g}" if r.weight != 1.0 else "") for k, r in rewards.items())
    return Check(passed, trace.reward, detail or "no rewards", metrics=metrics)


def trace_of(vt):
    """A verifiers trace of a rollout asked the task (its system prompt and prompt), not yet replied to."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask
    from verifiers.v1.types import SystemMessage, UserMessage

    data = vt.data
    prompt = [UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt or [])
    messages = ([SystemMessage(content=data.system_prompt)] if data.system_prompt else []) + prompt
    nodes = [MessageNode(parent=i - 1 if i else None, message=m) for i, m in enumerate(messages)]
    return Trace(task=TraceTask(type=type(vt).__name__, data=data, key=vt.key, hash=vt.hash),
                 agent=AgentInfo(config=vf.AgentConfig(), name="prime-agent", trainable=False), nodes=nodes)


def reply(trace, answer: str):
    """`trace` with the rollout's final answer as its last, sampled, assistant message: completed."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.types import AssistantMessage

    parent = len(trace.nodes) - 1 if trace.nodes else None
    trace.nodes.append(MessageNode(parent=parent, message=AssistantMessage(content=answer), sampled=True))
    trace.stop("agent_completed")
    trace.ok = True
    return trace


async def in_workspace(workspace: Path, use):
    """`await use(runtime)` with verifiers' subprocess runtime rooted at `workspace`, torn down after."""
    runtime = workspace_runtime()(workspace)
    try:
        return await use(runtime)
    finally:
        await runtime.stop()


@functools.cache
def workspace_runtime():
    """verifiers' subprocess runtime, rooted at a rollout's workspace, which it neither makes nor removes."""
    from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

    class WorkspaceRuntime(SubprocessRuntime):
        def __init__(self, workspace: Path) -> None:
            super().__init__(SubprocessConfig())
            self.workdir, self.info.id = Path(workspace), str(workspace)

        async def start(self) -> None:
            pass

        async def teardown(self) -> None:  # its background processes, never the workspace
            workdir, self.workdir = self.workdir, None
            try:
                await super().teardown()
            finally:
                self.workdir = workdir

        def cleanup(self) -> None:
            workdir, self.workdir = self.workdir, None
            try:
                super().cleanup()
            finally:
                self.workdir = workdir

    return WorkspaceRuntime


@functools.cache
def scoring_runtime():
    """verifiers' runtime for scoring: a rollout's workspace copied (`Scratch`), each command confined."""
    from verifiers.v1.errors import SandboxError as RuntimeFailed
    from verifiers.v1.runtimes.base import ProgramResult, Runtime
    from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntimeInfo

    class ScoringRuntime(Runtime):
        def __init__(self, scratch: Scratch) -> None:
            super().__init__()
            self.config = SubprocessConfig()
            self.info = SubprocessRuntimeInfo(**self.config.model_dump())
            self.scratch, self.workdir, self.info.id = scratch, scratch.work, str(scratch.work)

        async def start(self) -> None:
            pass

        async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
            ran = await self.scratch.run(argv, None, self.process_env(env))  # the task's stage deadline cuts it
            return ProgramResult(exit_code=ran.code, stdout=ran.stdout, stderr=ran.stderr)

        async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
            try:
                return await asyncio.to_thread(self.scratch.read, Path(path), max_bytes or READ_CAP)
            except OSError as e:
                raise RuntimeFailed(f"read {path!r}: {e}") from e

        async def write(self, path: str, data: bytes) -> None:
            try:
                await asyncio.to_thread(self.scratch.write, Path(path), data)
            except (OSError, ValueError) as e:
                raise RuntimeFailed(f"write {path!r}: {e}") from e

    return ScoringRuntime


READ_CAP = 64 << 20
"""Bytes a scoring runtime reads of one file when the task names no cap."""


def refuse_runtime(name: str, vt) -> None:
    """Tasks that need a container (an image of their own) are not run here."""
    if vt.NEEDS_CONTAINER or vt.data.image:
        raise ValueError(f"{name}: task {vt.data.idx} needs a container ({vt.data.image or 'NEEDS_CONTAINER'}), "
                         "which prime-agent does not provide")
