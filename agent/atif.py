"""Trajectories as ATIF v1.8 (the Agent Trajectory Interchange Format Harbor, Claude Code, Codex,
OpenHands and Terminus-2 write; models from the `atif` package), and back.

Export (`to_atif`): each system and user message is a step of its own; each model call an `agent`
step: the reply's text and reasoning, a `tool_call` (`ipython`, `{"code"}`) for each cell, the cells'
outputs as its `observation` (one result per cell), and `metrics`: prompt, completion and cached
tokens, cost, and, where the session recorded them (`model.record_logprobs`), `prompt_token_ids`,
`completion_token_ids` and `logprobs`; a native provider's reply as it came (Anthropic's blocks with
their thinking signatures, Responses' items with their encrypted reasoning) in `extra.provider_blocks`,
so an imported conversation can be sent back to that provider. Children are embedded in `subagent_trajectories` (their
ids referenced from the step that was running when they finished). A compaction or a rewind is a
system step whose `extra.context` is the whole conversation from there on. The rating (a reward)
and the harness version go in `final_metrics.extra`.

Import (`from_atif`): an ATIF document as our trajectory records, the messages each model call saw
and the tokens it sampled, so rl.data turns it into samples as it does a session of ours: a document
we wrote gives back the samples of the session it came from.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from atif import (
    Agent,
    ContentPart,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    SubagentTrajectoryRef,
    ToolCall,
)
from atif import Trajectory as Document

from agent.layout import SessionLayout
from agent.trajectory import (
    CellRecord,
    CompactionRecord,
    MessageRecord,
    ModelCall,
    Record,
    RewindRecord,
    SessionRecord,
    SubagentRecord,
    SystemPromptRecord,
    TurnFinishedRecord,
    TurnStartedRecord,
    read_records,
)
from agent.types import Blocks, Message, Usage
from agent.types import ToolCall as OurToolCall

SCHEMA_VERSION = "ATIF-v1.8"
CELL_OUTPUT = "[cell {n} output]\n{text}"
"""How text mode hands a reply's cells' outputs back, in one user message (agent/loop.py)."""


def _time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def _rating(layout: SessionLayout) -> float | None:
    """The session's rating (`prime-agent rate`), its reward; None when unrated."""
    try:
        return float(json.loads(layout.rating.read_text())["score"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def _arguments(call: OurToolCall) -> dict[str, Any]:
    try:
        parsed = json.loads(call.arguments)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"raw": call.arguments}


class _Builder:
    """Steps from one session's records, in order."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.call: ModelCall | None = None
        self.agent: Step | None = None
        """The last agent step: the tool messages and cells after it are its observation."""
        self.text_cells: list[CellRecord] = []
        """Text-mode cells of the last reply, not yet handed back."""
        self.native = False
        """The last reply made tool calls (tools mode): its cells are those calls."""

    def step(self, **fields: Any) -> Step:
        step = Step(step_id=len(self.steps) + 1, **fields)
        self.steps.append(step)
        return step

    def result(self, result: ObservationResult) -> None:
        assert self.agent is not None
        if self.agent.observation is None:
            self.agent.observation = Observation(results=[])
        self.agent.observation.results.append(result)

    def message(self, r: MessageRecord) -> None:
        m, extra = r.message, {"turn_id": r.turn_id} if r.turn_id else None
        if m.role == "assistant":
            self.assistant(r)
        elif m.role == "tool" and self.agent is not None and any(
                c.tool_call_id == m.tool_call_id for c in self.agent.tool_calls or []):
            self.result(ObservationResult(source_call_id=m.tool_call_id, content=m.content))
        elif m.role == "user" and self.text_cells and self.agent is not None and m.content == "\n\n".join(
                CELL_OUTPUT.format(n=n, text=c.result.render()) for n, c in enumerate(self.text_cells, 1)):
            for c in self.text_cells:  # the cells' outputs, handed back as one message
                self.result(ObservationResult(source_call_id=c.cell.id, content=c.result.render()))
            self.agent.extra = {**(self.agent.extra or {}), "observation_as": "user"}
            self.text_cells = []
        else:
            self.agent, self.text_cells = None, []
            self.step(source="system" if m.role == "system" else "user", message=m.content,
                      timestamp=_time(r.ts), extra={**(extra or {}), **({"role": m.role} if m.role == "tool" else {})}
                      or None)

    def assistant(self, r: MessageRecord) -> None:
        m, call = r.message, self.call
        self.call, self.text_cells, self.native = None, [], bool(r.message.tool_calls)
        usage = call.usage if call else Usage()
        metrics = Metrics(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                          cached_tokens=usage.cached_tokens, cost_usd=usage.cost,
                          prompt_token_ids=call.prompt_token_ids if call else None,
                          completion_token_ids=m.token_ids, logprobs=m.logprobs,
                          extra={k: v for k, v in (("reasoning_tokens", usage.reasoning_tokens),
                                                   ("cache_write_tokens", usage.cache_write_tokens)) if v} or None)
        extra: dict[str, Any] = {"turn_id": r.turn_id} if r.turn_id else {}
        if m.blocks is not None:  # the reply as its provider sent it (thinking signatures, encrypted reasoning)
            extra["provider_blocks"] = m.blocks.model_dump()
        if call is not None:
            extra.update(duration=call.duration, attempts=call.attempts, finish_reason=call.finish_reason)
        self.agent = self.step(
            source="agent", message=m.content, timestamp=_time(r.ts), model_name=call.model if call else None,
            reasoning_content=m.reasoning, metrics=metrics, llm_call_count=1, extra=extra or None,
            tool_calls=[ToolCall(tool_call_id=c.id, function_name=c.name, arguments=_arguments(c))
                        for c in m.tool_calls] or None)

    def cell(self, r: CellRecord) -> None:
        if self.agent is None:
            return
        calls = self.agent.tool_calls or []
        detail = {"duration": r.result.duration, "ok": r.result.ok, **(
            {"error": f"{r.result.error_name}: {r.result.error_value}"} if r.result.error_name else {})}
        if self.native:  # tools mode: the call the cell ran
            for c in calls:
                if c.tool_call_id == r.cell.id:
                    c.extra = {"cell": detail}
            return
        # text mode: the cell was fenced in the reply's text
        calls.append(ToolCall(tool_call_id=r.cell.id, function_name="ipython", arguments={"code": r.cell.code},
                              extra={"cell": detail, "fenced": True}))
        self.agent.tool_calls = calls
        self.text_cells.append(r)

    def context(self, kind: str, r: CompactionRecord | RewindRecord, text: str) -> None:
        """The conversation was replaced (a compaction, a rewind): a system step that carries it."""
        self.agent, self.text_cells = None, []
        self.step(source="system", message=text, timestamp=_time(r.ts),
                  extra={"event": kind, "turn_id": r.turn_id,
                         "context": [m.model_dump(mode="json", exclude_none=True) for m in r.messages or []]})


def to_atif(trajectory: Path, agent_version: str) -> Document:
    """A session's trajectory (and its children's, embedded) as an ATIF v1.8 document. Blocking I/O."""
    layout = SessionLayout(trajectory.parent)
    records = read_records(trajectory)
    session = next((r for r in records if isinstance(r, SessionRecord)), None)
    b = _Builder()
    children: list[Document] = []
    harness = session.harness_version if session else None
    for r in records:
        if isinstance(r, MessageRecord):
            b.message(r)
        elif isinstance(r, ModelCall) and r.purpose == "turn":
            b.call = r
        elif isinstance(r, CellRecord):
            b.cell(r)
        elif isinstance(r, SystemPromptRecord):
            b.agent = None
            b.step(source="system", message=r.content, timestamp=_time(r.ts),
                   extra={"event": "system_prompt", "turn_id": r.turn_id, "harness_version": r.harness_version})
        elif isinstance(r, CompactionRecord):
            b.context("compaction", r, r.summary)
        elif isinstance(r, RewindRecord) and r.messages is not None:
            b.context("rewind", r, r.notice or f"rewound to turn {r.turn}")
        elif isinstance(r, TurnFinishedRecord):
            harness = r.harness_version or harness
        elif isinstance(r, SubagentRecord):
            child = Path(r.dir) / "trajectory.jsonl"
            if not child.is_file():
                child = layout.child(r.name).trajectory
            ref = SubagentTrajectoryRef(trajectory_path=str(child), extra={"name": r.name, "outcome": r.outcome})
            if child.is_file():
                doc = to_atif(child, agent_version)
                doc.trajectory_id = ref.trajectory_id = r.child_id
                ref.session_id = doc.session_id
                children.append(doc)
            if b.agent is not None:
                b.result(ObservationResult(subagent_trajectory_ref=[ref]))
    metrics = [s.metrics for s in b.steps if s.metrics is not None]
    turns = [r for r in records if isinstance(r, TurnStartedRecord)]
    reward = _rating(layout)
    return Document(
        schema_version=SCHEMA_VERSION, session_id=session.session_id if session else None,
        agent=Agent(name="prime-agent", version=agent_version, model_name=session.model if session else None,
                    tool_definitions=_tools(session),
                    extra={"action_format": session.action_format} if session else None),
        steps=b.steps,
        final_metrics=FinalMetrics(
            total_prompt_tokens=sum(m.prompt_tokens or 0 for m in metrics),
            total_completion_tokens=sum(m.completion_tokens or 0 for m in metrics),
            total_cached_tokens=sum(m.cached_tokens or 0 for m in metrics),
            total_cost_usd=sum(m.cost_usd or 0.0 for m in metrics), total_steps=len(b.steps),
            extra={"reward": reward, "harness_version": harness, "turns": len(turns)}),
        extra={"cwd": session.cwd, "parent": session.parent} if session else None,
        subagent_trajectories=children or None)


def _tools(session: SessionRecord | None) -> list[dict[str, Any]] | None:
    from agent.actions import IPYTHON_TOOL

    return [IPYTHON_TOOL] if session is None or session.action_format == "tools" else None


# --- import ---------------------------------------------------------------------------------------


def reward_of(doc: Document) -> float | None:
    """The reward a document carries (`final_metrics.extra.reward`), if any."""
    extra = (doc.final_metrics.extra if doc.final_metrics else None) or {}
    reward = extra.get("reward")
    return float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None


def from_atif(doc: Document) -> list[Record]:
    """An ATIF document's steps as trajectory records: the model's context message by message, a
    `model_call` (with the prompt's token ids, where the step has them) before each reply, and
    compactions where the context was replaced. Embedded subagents are not included."""
    harness = ((doc.final_metrics.extra if doc.final_metrics else None) or {}).get("harness_version")
    out: list[Record] = [SessionRecord(session_id=doc.session_id or doc.trajectory_id or "atif", cwd="",
                                       model=doc.agent.model_name or doc.agent.name,
                                       action_format=(doc.agent.extra or {}).get("action_format", "tools"),
                                       harness_version=harness if isinstance(harness, str) else None)]
    for step in doc.steps:
        extra = step.extra or {}
        turn = extra.get("turn_id") if isinstance(extra.get("turn_id"), str) else None
        text = _text(step.message)
        if step.source == "system" and extra.get("event") in ("compaction", "rewind"):
            messages = [Message.model_validate(m) for m in extra.get("context") or []]
            out.append(CompactionRecord(turn_id=turn or "", summary=text, messages=messages, usage=Usage()))
        elif step.source == "system" and extra.get("event") == "system_prompt":
            out.append(SystemPromptRecord(turn_id=turn or "", content=text,
                                          harness_version=extra.get("harness_version")))
        elif step.source != "agent":
            role = "tool" if extra.get("role") == "tool" else step.source
            out.append(MessageRecord(turn_id=turn, message=Message(role=role, content=text)))
        else:
            out.extend(_agent_step(step, text, turn))
    return out


def _text(content: str | list[ContentPart] | None) -> str:
    """A message's or a result's text (the text parts of a multimodal one)."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.text or "" for p in content if p.type == "text")


def _blocks(value: Any) -> Blocks | None:
    """A step's provider blocks, where they are ours to send back (another agent's, or a malformed
    value, are left out: the step's text and calls stand)."""
    try:
        return Blocks.model_validate(value) if value else None
    except ValidationError:
        return None


def _agent_step(step: Step, text: str, turn: str | None) -> list[Record]:
    m, extra = step.metrics or Metrics(), step.extra or {}
    fenced = extra.get("observation_as") == "user" or any((c.extra or {}).get("fenced") for c in step.tool_calls or [])
    calls = [] if fenced else [OurToolCall(id=c.tool_call_id, name=c.function_name,
                                           arguments=c.arguments["raw"] if set(c.arguments) == {"raw"}
                                           else json.dumps(c.arguments)) for c in step.tool_calls or []]
    usage = Usage(prompt_tokens=m.prompt_tokens or 0, completion_tokens=m.completion_tokens or 0,
                  cached_tokens=m.cached_tokens or 0, cost=m.cost_usd or 0.0,
                  cache_write_tokens=(m.extra or {}).get("cache_write_tokens") or 0)
    out: list[Record] = []
    if step.llm_call_count != 0:
        out.append(ModelCall(turn_id=turn or "", context_messages=0, usage=usage, duration=0.0, attempts=1,
                             model=step.model_name or "", prompt_token_ids=m.prompt_token_ids))
    out.append(MessageRecord(turn_id=turn, message=Message(
        role="assistant", content=text, tool_calls=calls, reasoning=step.reasoning_content,
        token_ids=m.completion_token_ids, logprobs=m.logprobs,
        blocks=_blocks(extra.get("provider_blocks")))))
    results = [r for r in (step.observation.results if step.observation else []) if r.content is not None]
    contents = [_text(r.content) for r in results]
    if fenced and results:
        out.append(MessageRecord(turn_id=turn, message=Message(role="user", content="\n\n".join(
            CELL_OUTPUT.format(n=n, text=c) for n, c in enumerate(contents, 1)))))
    else:
        for r, content in zip(results, contents):
            message = (Message(role="tool", tool_call_id=r.source_call_id, content=content) if r.source_call_id
                       else Message(role="user", content=content))
            out.append(MessageRecord(turn_id=turn, message=message))
    return out
