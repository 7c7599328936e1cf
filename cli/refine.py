"""`prime-agent refine SESSION` and `prime-agent refine approve|reject ID --session SESSION`.

Refines the harness from a session's recorded trajectory (the session need not be running; a
running one picks the change up at its next turn boundary), or decides a refinement that waits
for review.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent.config import ConfigError, home, load_config, project_root
from agent.harness import SessionHarness, scope_roots
from agent.model import ModelError, OpenAIModel
from agent.refine import check_skill, model_caller, transcript
from agent.trajectory import RefinementRecord, SessionRecord, TrajectoryWriter, contexts, read_records
from harness_store.refiner import Outcome, Plan, RefinementFailed, Refiner
from cli.trajectory import find_trajectory


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("what", metavar="SESSION|approve|reject", help="a session id (or 'last'), or approve/reject")
    p.add_argument("id", nargs="?", help="with approve/reject: the refinement id")
    p.add_argument("--session", help="with approve/reject: the session the refinement belongs to")
    p.add_argument("--instructions", help="what the refinement should focus on")
    p.add_argument("--mode", choices=["auto", "review", "dry-run"], help="override refine.mode")


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (FileNotFoundError, KeyError, ConfigError, ModelError, RefinementFailed) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2


async def _main(args: argparse.Namespace) -> int:
    deciding = args.what in ("approve", "reject")
    ref = args.session if deciding else args.what
    if deciding and (not args.id or not ref):
        raise KeyError("usage: prime-agent refine approve|reject REFINEMENT_ID --session SESSION")
    path = find_trajectory(ref)
    records = read_records(path)
    meta = next(r for r in records if isinstance(r, SessionRecord))
    cwd = Path(meta.cwd)
    config = load_config(cwd)
    if args.mode:
        config.refine.mode = args.mode
    harness = SessionHarness(scope_roots(home(), project_root(cwd), path.parent), meta.session_id)
    model = OpenAIModel(config.model) if config.model.name else None
    try:
        refiner = Refiner(harness.stores, model_caller(model, config) if model else _no_model, mode=config.refine.mode,
                          default_scope=config.refine.default_scope, check_skill=check_skill)
        if deciding:
            pending = path.parent / "refinements" / f"{args.id}.json"
            if not pending.is_file():
                raise KeyError(f"no refinement {args.id!r} waits for review in session {meta.session_id}")
            plan = Plan.from_json(pending.read_text())
            if args.what == "approve":
                outcome = await refiner.apply(plan, session=meta.session_id, generation=plan.generation, approved=True)
            else:
                outcome = Outcome(plan, "rejected", reason="rejected by the user")
            pending.unlink()
        else:
            evidence = transcript(list(contexts(records))[-1], config.refine.window_chars)
            plan = await refiner.plan(evidence, harness.view.render(), trigger="explicit", instructions=args.instructions)
            outcome = await refiner.apply(plan, session=meta.session_id)
            if outcome.status == "pending":
                (path.parent / "refinements").mkdir(exist_ok=True)
                (path.parent / "refinements" / f"{plan.id}.json").write_text(plan.to_json())
    finally:
        harness.close()
        if model:
            await model.close()
    _record(path, outcome)
    _report(outcome, meta.session_id)
    return 0 if outcome.status in ("applied", "pending", "dry-run") else 1


async def _no_model(messages):
    raise RefinementFailed("no model configured to plan with (set PRIME_AGENT_MODEL and OPENAI_BASE_URL)")


def _record(path: Path, outcome: Outcome) -> None:
    plan = outcome.plan
    writer = TrajectoryWriter(path)  # one appended line: safe beside a running session's writer
    writer.append(RefinementRecord(
        refinement_id=plan.id, trigger=plan.trigger, status=outcome.status, summary=plan.proposal.summary,
        rationale=plan.proposal.rationale, edits=[e.model_dump() for e in outcome.applied],
        refused=[{"id": e.id, "reason": r} for e, r in outcome.refused],
        commit=outcome.change.commit if outcome.change else None, reason=outcome.reason or None,
    ))
    writer.close()


def _report(outcome: Outcome, session_id: str) -> None:
    plan = outcome.plan
    print(f"{plan.id} {outcome.status}: {plan.proposal.summary}" + (f" ({outcome.reason})" if outcome.reason else ""))
    for edit, reason in outcome.refused:
        print(f"  refused {edit.action} {edit.id}: {reason}")
    if outcome.diff:
        print(outcome.diff)
    if outcome.status == "pending":
        print(f"approve with: prime-agent refine approve {plan.id} --session {session_id}")
