"""`prime-agent refine SESSION`, `prime-agent refine approve|reject ID --session SESSION`, and
`prime-agent refine loop TASKSET ...` (cli/refine_loop.py: does refinement help on held-out tasks?).

Refines the harness from a session's evidence, or decides a refinement that waits for review.
One path, the session's own refiner (agent.refine.SessionRefiner), with its regression gate:
a session the daemon hosts is refined through the daemon (so nothing else writes its trajectory
or invalidates its plans behind its back); any other session here, in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import cast

from agent import events as ev
from agent.config import ConfigError, home, load_config, project_root
from agent.model import ModelError
from agent.trajectory import SessionRecord, read_records
from agent.types import Usage
from cli import refine_loop
from cli.trajectory import find_trajectory
from daemon.client import Client, DaemonError, daemon_pid
from harness_store.refiner import RefinementError

STATUS = {"refinement.applied": "applied", "refinement.pending": "pending", "refinement.dry_run": "dry-run",
          "refinement.rejected": "rejected"}
"""What each outcome event says of the refinement."""


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("what", metavar="SESSION|approve|reject|loop",
                   help="a session id (or 'last'), approve/reject, or loop (measure refinement on held-out tasks)")
    p.add_argument("id", nargs="?", help="with approve/reject: the refinement id; with loop: the task set")
    p.add_argument("--session", help="with approve/reject: the session the refinement belongs to")
    p.add_argument("--instructions", help="what the refinement should focus on")
    p.add_argument("--mode", choices=["auto", "review", "dry-run"], help="override refine.mode")
    refine_loop.add_arguments(p)


def main(args: argparse.Namespace) -> int:
    if args.what == "loop":
        if extra := [f for f, v in (("--session", args.session), ("--instructions", args.instructions),
                                    ("--mode", args.mode)) if v]:
            print(f"prime-agent: refine loop takes no {', '.join(extra)}", file=sys.stderr)
            return 2
        return refine_loop.main(args)
    if extra := refine_loop.given(args):
        print(f"prime-agent: {', '.join(extra)}: options of `prime-agent refine loop TASKSET`", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except (FileNotFoundError, KeyError, ConfigError, ModelError, RefinementError) as e:
        print(f"prime-agent: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 2 if e.status in (400, 404, 409) else 1


def decide(session: str, refinement_id: str, approve: bool) -> int:
    """Approve or reject a refinement waiting for review (`prime-agent harness review ID --accept` too)."""
    return main(argparse.Namespace(what="approve" if approve else "reject", id=refinement_id, session=session,
                                   instructions=None, mode=None))


async def _main(args: argparse.Namespace) -> int:
    deciding = args.what in ("approve", "reject")
    ref = args.session if deciding else args.what
    if deciding and (not args.id or not ref):
        raise KeyError("usage: prime-agent refine approve|reject REFINEMENT_ID --session SESSION")
    path = find_trajectory(ref)
    records = read_records(path)
    meta = next(r for r in records if isinstance(r, SessionRecord))
    client = await _daemon_hosting(meta.session_id)
    if client is not None:
        async with client:
            return await _through_daemon(client, meta.session_id, args, deciding)
    return await _here(path, records, meta, args, deciding)


async def _daemon_hosting(session_id: str) -> Client | None:
    """A client of the running daemon, when it hosts this session."""
    if daemon_pid() is None:
        return None
    client = Client()
    try:
        await client.session(session_id)
    except DaemonError:  # not one of its sessions (or it just stopped): refine it here
        await client.close()
        return None
    return client


async def _through_daemon(client: Client, session_id: str, args: argparse.Namespace, deciding: bool) -> int:
    after = (await client.session(session_id)).last_seq
    if deciding:
        decided = await client.decide_refinement(session_id, args.id, args.what == "approve")
        if decided.status == "ready":
            print(f"{args.id} approved: it applies at the session's next turn boundary")
            return 0
    else:
        started = await client.refine(session_id, args.instructions, args.mode)
        print(started.message, file=sys.stderr)
    async for event in client.events(session_id, after):
        if isinstance(event, ev.Decided) and event.id == args.id if deciding else _outcome(event):
            return _report(event, session_id)
    raise AssertionError("unreachable: the event stream does not end")


async def _here(path: Path, records: list, meta: SessionRecord, args: argparse.Namespace, deciding: bool) -> int:
    """Refine a session no process hosts, with its own refiner over its recorded context."""
    from agent.context import Context, Current, Sinks
    from agent.harness import SessionHarness, scope_roots
    from agent.layout import SessionLayout
    from agent.model import Model
    from agent.providers import open_model
    from agent.refine import SessionRefiner
    from agent.trajectory import TrajectoryWriter, contexts
    from evals.gate import gate_for

    cwd = Path(meta.cwd)
    config = load_config(cwd)
    layout = SessionLayout(path.parent)
    harness = SessionHarness(scope_roots(home(), project_root(cwd), layout.dir), meta.session_id,
                             config.harness.limits())
    model = open_model(config.model) if config.model.configured else None
    writer = TrajectoryWriter(path)
    said: list[ev.Event] = []
    spent: list[Usage] = []
    context = Context(writer.append)
    context.messages = (list(contexts(records)) or [[]])[-1]
    sinks = Sinks(emit=said.append, record=writer.append, charge=lambda usage, purpose, turn_id: spent.append(usage),
                  turn_id=lambda: None)
    current = Current(cast(Model, model), config)  # no model: planning says none is configured (model_caller)
    refiner = SessionRefiner(current, harness, context, layout, meta.session_id, sinks, gate=gate_for if model else None)
    try:
        if deciding:
            await refiner.decide(args.id, args.what == "approve")
        else:
            refiner.request(args.instructions, trigger="explicit", mode=args.mode)
            await refiner.task
    finally:
        writer.close()
        if model:
            await model.close()
    if tokens := sum(u.total_tokens for u in spent):
        print(f"[the refiner used {tokens:,} tokens]", file=sys.stderr)
    return _report(next(e for e in said if _outcome(e)), meta.session_id)


def _outcome(event: ev.Event) -> bool:
    return isinstance(event, ev.Decided | ev.RefinementFailed | ev.RefinementSkipped)


def _report(event: ev.Event, session_id: str) -> int:
    if isinstance(event, ev.RefinementFailed):
        print(f"prime-agent: the refinement failed: {event.reason}", file=sys.stderr)
        return 1
    if isinstance(event, ev.RefinementSkipped):
        print(f"nothing to refine: {event.rationale}")
        return 0
    assert isinstance(event, ev.Decided)
    status = STATUS[event.type]
    print(f"{event.id} {status}: {event.summary}" + (f" ({event.reason})" if event.reason else ""))
    for refused in event.refused:
        print(f"  refused {refused.id}: {refused.reason}")
    if event.diff:
        print(event.diff)
    if status == "pending":
        print(f"approve with: prime-agent refine approve {event.id} --session {session_id}")
    return 0 if status in ("applied", "pending", "dry-run") else 1
