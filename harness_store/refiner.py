"""The refiner: turns evidence from a session into small, validated, reversible harness edits.

It imports nothing of the agent: the caller hands it a `complete(messages, schema) -> text` callable
for the model (`schema`: the reply's JSON schema, which a client of a server that can enforce one
sends along; the reply is validated here either way), and optionally a `gate(plan) -> Verdict` for a
regression check and a `check_skill(id, body, files) -> reason | None` that runs a skill in a scratch kernel.

    plan = await refiner.plan(evidence, view, trigger="explicit")   # in the background
    outcome = await refiner.apply(plan, session=...)                 # at a turn boundary
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness_store.entries import HarnessError, Kind, Source, check_id, safe_relative
from harness_store.store import Change, Edit, HarnessStore, Scope


class Complete(Protocol):
    """The model, for planning: the reply's text to `messages`, asked to match the JSON `schema`."""

    def __call__(self, messages: list[dict[str, str]], schema: dict[str, Any] | None = None) -> Awaitable[str]: ...


SkillCheck = Callable[[str, str, dict[str, str]], Awaitable["str | None"]]


class ProposedEdit(BaseModel):
    model_config = ConfigDict(extra="ignore")

    action: Literal["create", "update", "delete"]
    kind: Kind | None = None
    id: str | None = None
    title: str | None = None
    description: str | None = None
    content: str | None = None
    scope: Scope | None = None
    reason: str = ""
    files: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None


class Proposal(BaseModel):
    model_config = ConfigDict(extra="ignore")

    summary: str
    rationale: str = ""
    expected_outcome: str = ""
    edits: list[ProposedEdit] = Field(default_factory=list)


class Review(BaseModel):
    model_config = ConfigDict(extra="ignore")

    should_refine: bool
    rationale: str = ""
    instructions: str | None = None


class RefinementError(Exception):
    """Planning produced nothing usable; the message is the reason."""


@dataclass
class Verdict:
    accept: bool
    reason: str


@dataclass
class Plan:
    """A proposal with what it was planned against."""

    id: str
    trigger: str
    proposal: Proposal
    versions: dict[str, str | None]
    """Each entry's file version when planning began (for the conflict check)."""
    generation: int = 0
    """The session's generation when planning began; a plan from an older one is stale."""
    evidence: str = ""
    created: float = field(default_factory=time.time)
    source: Source = "refine"
    """Who wrote the edits: the refiner, or the agent (a cell's edit of a wider scope than its session's)."""

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "trigger": self.trigger, "proposal": self.proposal.model_dump(),
                           "versions": self.versions, "generation": self.generation, "evidence": self.evidence,
                           "created": self.created, "source": self.source}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        return cls(d["id"], d["trigger"], Proposal.model_validate(d["proposal"]), d["versions"], d["generation"],
                   d["evidence"], d["created"], d.get("source", "refine"))


@dataclass
class Outcome:
    plan: Plan
    status: Literal["ready", "applied", "rejected", "dry-run", "pending"]
    applied: list[ProposedEdit] = field(default_factory=list)
    """The edits that passed validation (and, once status is `applied`, landed)."""
    refused: list[tuple[ProposedEdit, str]] = field(default_factory=list)
    change: Change | None = None
    diff: str = ""
    reason: str = ""
    edits: list[tuple[ProposedEdit, Scope, Edit]] = field(default_factory=list)
    """The validated store edits, for commit()."""


NEGATION = re.compile(r"(?i)\b(never|not|don'?t|do not|avoid|no)\b")


class Rules(BaseModel):
    """Deterministic policy: edits matching any pattern are refused with the rule's name."""

    model_config = ConfigDict(extra="forbid")

    secrets: list[str] = Field(default_factory=lambda: [
        r"\bsk-[A-Za-z0-9_-]{20,}", r"\bghp_[A-Za-z0-9]{30,}", r"\bgithub_pat_[A-Za-z0-9_]{30,}", r"\bAKIA[0-9A-Z]{16}\b",
        r"\bxox[abprs]-[A-Za-z0-9-]{10,}", r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        r"(?i)\b(api[_-]?key|secret|token|password)\b\s*[:=]\s*['\"]?[A-Za-z0-9_\-/+]{16,}",
    ])
    """Secrets: API keys, tokens, private keys."""
    weakening: list[str] = Field(default_factory=lambda: [
        r"(?i)\b(skip|delete|remove|disable|ignore|comment out|xfail|bypass)\w*\b[^.\n]{0,60}\b(tests?|checks?|assert\w*|lint\w*|ci|evals?|evaluation|type.?check\w*|hooks?)\b",
        r"(?i)\b(tests?|checks?|ci|hooks?)\b[^.\n]{0,40}\b(can|may|should)\s+be\s+(skipped|ignored|deleted|disabled)",
        r"--no-verify", r"(?i)pytest\.mark\.skip", r"(?i)\|\|\s*true\b",
        r"(?i)\b(sudo|chmod\s+-?R?\s*777|disable\s+the\s+sandbox|bypass\s+permissions?)\b",
    ])
    """Edits that weaken tests, checks, evaluation or permissions."""

    def violation(self, text: str) -> str | None:
        for p in self.secrets:
            if m := re.search(p, text):
                return f"policy: looks like a secret ({m.group(0)[:12]!r}...)"
        for p in self.weakening:
            for m in re.finditer(p, text):
                sentence = text[max(text.rfind(".", 0, m.start()), text.rfind("\n", 0, m.start())) + 1 : m.start()]
                if not NEGATION.search(sentence):  # "never skip the tests" is the opposite of weakening them
                    return f"policy: looks like weakening tests, checks or permissions ({m.group(0)[:40]!r})"
        return None


def _prompt(name: str) -> str:
    return resources.files("harness_store").joinpath("prompts", name).read_text(encoding="utf-8")


REPLY_MAX_ITEMS = 4
"""Under an enforced reply schema: the most edits a proposal, files a skill's map, keys a metadata map."""


def reply_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a reply is asked to match: `model`'s, with each of its objects closed to keys it
    does not name, each open map (a skill's files) and list (the edits) held to `REPLY_MAX_ITEMS`.
    Parsing stays lenient (extra keys are ignored). A server that enforces the schema must leave a small
    model no endless path: SmolLM2-135M, held to the open one, wrote `"reason_type_name": "create", `
    over and over, and held to closed objects, one file after another into a skill's `files`, until
    its token limit cut the plan short."""

    def close(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: close(v) for k, v in node.items()}
            if "properties" in node:
                node.setdefault("additionalProperties", False)
            elif node.get("type") == "object":
                node.setdefault("maxProperties", REPLY_MAX_ITEMS)
            elif node.get("type") == "array":
                node.setdefault("maxItems", REPLY_MAX_ITEMS)
        elif isinstance(node, list):
            node = [close(v) for v in node]
        return node

    return close(model.model_json_schema())


def parse_json_reply(text: str, model: type[BaseModel]):
    """The first JSON object in a reply (fences and prose around it are fine), as `model`."""
    start = text.find("{")
    if start < 0:
        raise RefinementError(f"the reply holds no JSON object: {text[:200]!r}")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as e:
        raise RefinementError(f"the reply's JSON is invalid or truncated: {e}") from None
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        raise RefinementError(f"the reply is not a valid {model.__name__}: {problems}") from None


class Refiner:
    def __init__(
        self,
        stores: dict[Scope, HarnessStore],
        complete: Complete,
        *,
        mode: Literal["auto", "review", "dry-run"] = "auto",
        default_scope: Scope = "session",
        gate: Callable[[Plan], Awaitable[Verdict]] | None = None,
        check_skill: SkillCheck | None = None,
        rules: Rules | None = None,
        history: int = 10,
    ):
        self.stores = stores
        self.complete = complete
        self.mode = mode
        self.default_scope = default_scope
        self.gate = gate
        self.check_skill = check_skill
        self.rules = rules or Rules()
        self.history = history

    async def review(self, evidence: str) -> Review:
        """The cheap call before an auto-refine: is there a lesson here at all?"""
        reply = await self.complete([{"role": "system", "content": _prompt("review.md")},
                                     {"role": "user", "content": evidence}], schema=reply_schema(Review))
        return parse_json_reply(reply, Review)

    async def plan(self, evidence: str, view: str, *, trigger: str, instructions: str | None = None,
                   generation: int = 0) -> Plan:
        """One model call over the evidence, the harness view and recent refinements."""
        versions = self._versions()
        parts = [f"# Current harness\n{view or '(empty)'}", f"# Recent refinements\n{self._history() or '(none)'}",
                 f"# Session transcript (most recent part)\n{evidence}"]
        if instructions:
            parts.append(f"# Focus\n{instructions}")
        reply = await self.complete([{"role": "system", "content": _prompt("plan.md")},
                                     {"role": "user", "content": "\n\n".join(parts)}], schema=reply_schema(Proposal))
        proposal = parse_json_reply(reply, Proposal)
        rid = f"r-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        return Plan(rid, trigger, proposal, versions, generation, evidence=_evidence_line(proposal))

    def _versions(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for scope, store in self.stores.items():
            for entry in store.entries():
                out[f"{scope}:{entry.id}"] = store.version_of(entry.id)
        return out

    def _history(self) -> str:
        lines = []
        for scope, store in self.stores.items():
            if (store.root / ".git").is_dir():
                lines += [f"- {c.date:%Y-%m-%d} [{scope}] {c.refinement_id}: {c.summary}"
                          for c in store.log(self.history) if c.trigger in ("refine", "refine-loop", "rollback")]
        return "\n".join(sorted(lines, reverse=True)[: self.history])

    async def validate(self, plan: Plan) -> tuple[list[tuple[ProposedEdit, Scope, Edit]], list[tuple[ProposedEdit, str]]]:
        """Judge each edit alone: (valid edits with their scope and store edit, refused edits with reasons)."""
        ok, refused = [], []
        seen: set[tuple[str, str]] = set()
        for pe in plan.proposal.edits:
            try:
                scope, edit = self._check(pe, plan, seen)
                if pe.kind == "skill" and pe.action != "delete" and self.check_skill is not None:
                    problem = await self.check_skill(edit.id, edit.body or "", edit.files or {})
                    if problem:
                        raise RefinementError(f"skill check: {problem}")
                ok.append((pe, scope, edit))
                seen.add((scope, edit.id))
            except (HarnessError, RefinementError, ValueError) as e:
                refused.append((pe, str(e)))
        return ok, refused

    def _check(self, pe: ProposedEdit, plan: Plan, seen: set) -> tuple[Scope, Edit]:
        if not pe.id:
            raise RefinementError("the edit has no id")
        check_id(pe.id)  # the base prompt and malformed ids are refused here
        scope: Scope = pe.scope or self.default_scope
        if scope not in self.stores:
            raise RefinementError(f"unknown scope {scope!r}")
        if (scope, pe.id) in seen:
            raise RefinementError(f"{pe.id!r} is edited twice in one proposal")
        store = self.stores[scope]
        planned = plan.versions.get(f"{scope}:{pe.id}")
        current = store.version_of(pe.id)
        if current != planned:
            raise RefinementError(f"conflict: {pe.id!r} changed in the {scope} scope since planning began")
        if pe.action == "create" and current is not None:
            raise RefinementError(f"{pe.id!r} already exists in the {scope} scope; update it instead")
        if pe.action != "create" and current is None:
            raise RefinementError(f"no entry {pe.id!r} in the {scope} scope to {pe.action}")
        if pe.action == "create" and pe.kind is None:
            raise RefinementError(f"creating {pe.id!r} needs a kind")
        text = "\n".join(filter(None, [pe.title, pe.description, pe.content, *(pe.files or {}).values()]))
        violation = self.rules.violation(text)
        if violation:
            raise RefinementError(violation)
        for path in pe.files or {}:
            safe_relative(path)
        edit = Edit(pe.action, pe.id, kind=pe.kind if pe.action == "create" else None, title=pe.title,
                    description=pe.description, body=pe.content, metadata=pe.metadata, files=pe.files, base=planned)
        store.dry_run(edit)  # schema, size caps, kind rules: everything apply() would refuse
        return scope, edit

    async def prepare(self, plan: Plan, *, approved: bool = False, mode: str | None = None) -> Outcome:
        """Everything but the commit (validation, skill checks, the gate): safe to run in the
        background while the session works. `approved` skips review mode's wait; `mode` overrides
        the refiner's for this plan."""
        mode = mode or self.mode
        ok, refused = await self.validate(plan)
        if not ok:
            return Outcome(plan, "rejected", refused=refused, reason="no valid edits" if refused else "the proposal has no edits")
        outcome = Outcome(plan, "ready", [pe for pe, _, _ in ok], refused, diff=render_edits(ok))
        outcome.edits = ok
        if mode == "dry-run":
            outcome.status = "dry-run"
        elif self.gate is not None:  # judge exactly the edits that passed validation
            valid = Proposal.model_validate({**plan.proposal.model_dump(), "edits": [pe.model_dump() for pe, _, _ in ok]})
            verdict = await self.gate(dataclasses.replace(plan, proposal=valid))
            if not verdict.accept:
                return Outcome(plan, "rejected", refused=refused + [(pe, f"gate: {verdict.reason}") for pe, _, _ in ok],
                               reason=f"gate: {verdict.reason}")
        if outcome.status == "ready" and mode == "review" and not approved:
            outcome.status = "pending"
        return outcome

    def commit(self, outcome: Outcome, *, session: str | None = None, generation: int = 0,
               trailers: dict[str, str] | None = None) -> Outcome:
        """Land a ready outcome: one commit per scope touched (with `trailers` besides the plan's).
        Quick: run it at a turn boundary."""
        plan = outcome.plan
        if plan.generation != generation:
            return Outcome(plan, "rejected", refused=[(pe, "stale") for pe in outcome.applied],
                           reason="stale: the session was interrupted, reset or rolled back since planning")
        by_scope: dict[Scope, list[Edit]] = {}
        for _, scope, edit in outcome.edits:
            by_scope.setdefault(scope, []).append(edit)
        try:  # every scope still accepts its edits (nothing changed since validation), or none lands
            for _, scope, edit in outcome.edits:
                self.stores[scope].dry_run(edit)
        except HarnessError as e:
            return Outcome(plan, "rejected", refused=[(pe, str(e)) for pe in outcome.applied], reason=str(e))
        diffs = []
        try:
            for scope, edits in by_scope.items():
                store = self.stores[scope]
                summary = (plan.proposal.summary if plan.source == "agent"
                           else f"refine: {plan.proposal.summary}\n\n{plan.proposal.rationale}")
                outcome.change = store.apply(
                    edits, summary=summary, trigger=plan.trigger, source=plan.source, refinement_id=plan.id,
                    session=session, evidence=plan.evidence, trailers=trailers)
                diffs.append(store.diff(outcome.change.commit + "~1", outcome.change.commit))
        except HarnessError as e:  # e.g. a person edited the entry after validation: nothing of this scope landed
            return Outcome(plan, "rejected", refused=[(pe, str(e)) for pe in outcome.applied], reason=str(e))
        outcome.status, outcome.diff = "applied", "\n".join(diffs)
        return outcome

    async def apply(self, plan: Plan, *, session: str | None = None, generation: int = 0,
                    approved: bool = False) -> Outcome:
        """prepare() then commit(), for callers with no turn loop to wait for (the CLI)."""
        outcome = await self.prepare(plan, approved=approved)
        return self.commit(outcome, session=session, generation=generation) if outcome.status == "ready" else outcome


def render_edits(ok: list[tuple[ProposedEdit, Scope, Edit]]) -> str:
    """A readable summary of what a plan would change (for dry runs and reviews)."""
    out = []
    for pe, scope, _ in ok:
        out.append(f"{pe.action} {pe.kind or ''} {pe.id} ({scope}): {pe.title or ''}".replace("  ", " "))
        if pe.content:
            out += [f"+ {line}" for line in pe.content.splitlines()]
    return "\n".join(out)


def _evidence_line(p: Proposal) -> str:
    reasons = "; ".join(e.reason for e in p.edits if e.reason)
    return (reasons or p.rationale)[:300]
