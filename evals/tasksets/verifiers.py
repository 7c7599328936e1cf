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

Not yet: tasks that need a runtime (setup or finalize hooks, or rewards that read the box) are refused
when dealt, saying so, rather than scored without what they read.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

from evals.env import Check, MissingPackage, Task

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
    def __init__(self, taskset_id: str, options: dict[str, Any], spec: str | None = None):
        loaders = verifiers_loaders()
        from pydantic import ValidationError

        self.name = spec or f"vf:{taskset_id}"
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

    def check(self, task: Task, answer: str, workspace: Path | None) -> Check:
        return asyncio.run(score(self._task(task), answer))

    def reward(self, task: Task, answer: str) -> float:
        return self.check(task, answer, None).reward


async def score(vt, answer: str) -> Check:
    """The task's own rewards and metrics on a trace whose last reply is `answer`, as verifiers scores a
    finished rollout (`Task.score` under the task's scoring timeout)."""
    trace = trace_of(vt, answer)
    try:
        async with asyncio.timeout(vt.data.timeout.scoring):
            await vt.score(trace)
    except TimeoutError:
        trace.record_timeout("scoring")
        raise TimeoutError(f"scoring ran past the task's {vt.data.timeout.scoring:g}s") from None
    except Exception as e:  # verifiers' TaskError: the task's scorer raised
        return Check(False, 0.0, "the task's scoring raised", error=f"{type(e).__name__}: {e}")
    rewards = {k: r for k, r in trace.rewards.items() if r is not None}
    metrics = {k: float(v) for k, v in trace.metrics.items() if v is not None}
    passed = bool(rewards) and all(r.score >= 1.0 for r in rewards.values())
    detail = ", ".join(f"{k}={r.score:.3f}" + (f"x{r.weight:g}" if r.weight != 1.0 else "") for k, r in rewards.items())
    return Check(passed, trace.reward, detail or "no rewards", metrics=metrics)


def trace_of(vt, answer: str):
    """A verifiers trace of a rollout that was asked the task and replied `answer`."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask
    from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage

    data = vt.data
    prompt = [UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt or [])
    messages = ([SystemMessage(content=data.system_prompt)] if data.system_prompt else []) + prompt
    nodes = [MessageNode(parent=i - 1 if i else None, message=m) for i, m in enumerate(messages)]
    nodes.append(MessageNode(parent=len(nodes) - 1 if nodes else None, message=AssistantMessage(content=answer),
                             sampled=True))
    trace = Trace(task=TraceTask(type=type(vt).__name__, data=data, key=vt.key, hash=vt.hash),
                  agent=AgentInfo(config=vf.AgentConfig(), name="prime-agent", trainable=False), nodes=nodes)
    trace.stop("agent_completed")
    trace.ok = True
    return trace


def refuse_runtime(name: str, vt) -> None:
    """Tasks whose setup, finalize or scoring need verifiers' runtime (a box with files) are not run yet."""
    import verifiers.v1 as vf

    def needs(fn) -> bool:
        param = inspect.signature(fn).parameters.get("runtime")
        return param is not None and param.default is inspect.Parameter.empty

    hooks = [fn.__name__ for fn in (*vt.hooks("reward"), *vt.hooks("metric")) if needs(fn)]
    hooks += [h for h in ("setup", "finalize") if getattr(type(vt), h) is not getattr(vf.Task, h)]
    if vt.NEEDS_CONTAINER or hooks:
        raise ValueError(f"{name}: task {vt.data.idx} needs verifiers' runtime ({', '.join(hooks) or 'a container'}), "
                         "which prime-agent does not provide yet")
