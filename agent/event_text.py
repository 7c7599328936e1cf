"""Events as a person reads them: one sentence per event, which the app (tui/widgets/conversation.py)
and the command line (cli/show.py) both show, so a fact reads the same in both."""

from __future__ import annotations

from agent import events as ev
from agent.events import Event


def spent(e: ev.TurnFinished) -> str:
    """A turn's usage and cost, with what besides its own steps it paid for."""
    others = ", ".join(f"{purpose} {u.describe()}" for purpose, u in e.spend.items() if purpose != "turn")
    return f"{e.turn_id}: {e.usage.describe()}" + (f" (of which {others})" if others else "")


def describe(e: Event) -> str:
    """The event as a sentence for a person (the app's notice, the command line's line)."""
    match e:
        case ev.UsageCharged():
            return f"{e.purpose} for {e.turn_id or 'the session'}: {e.usage.describe()}"
        case ev.ModelFallback():
            return f"model: {e.from_model} keeps failing ({e.reason}); switched to {e.to_model}"
        case ev.SessionStarted():
            return f"session {e.session_id} started in {e.cwd} ({e.model})" + (
                f"; sandbox: {e.sandbox}" if e.sandbox and e.sandbox != "workspace-write" else "") + "".join(
                f"\nproject: {line}" for line in e.ignored)
        case ev.SessionResumed():
            return f"session resumed ({e.reason}): a new kernel; variables from before are gone"
        case ev.Note():
            return f"note: {e.text}"
        case ev.Error():
            return f"error: {e.message}"
        case ev.SteerDelivered():
            return f"steer delivered: {e.text}"
        case ev.ModelRetry():
            return f"model: {e.reason}; retry {e.attempt} in {e.delay:.1f}s"
        case ev.Rewound():
            where = f"{'the end of' if e.after else 'before'} turn {e.turn}"
            files = ", ".join(f.path for f in e.files[:8]) + (f" +{len(e.files) - 8}" if len(e.files) > 8 else "")
            kernel = e.kernel.get("status", "")
            forced = f"; overwrote {', '.join(e.forced)}" if e.forced else ""
            return (f"rewound to {where} ({', '.join(e.parts)})" + (f"; files: {files}" if files else "")
                    + (f"; namespace {kernel}" if kernel else "") + forced)
        case ev.Compaction():
            return f"context compacted ({e.folded_messages} messages summarised)"
        case ev.HarnessEdited():
            by = "by you" if e.source == "user" else "from outside the sandbox (an unsandboxed kernel ran)"
            return f"harness edited {by} ({e.scope}): {', '.join(e.entries)}" + (
                f"; problems: {'; '.join(e.problems)}" if e.problems else "")
        case ev.RefinementProposed():
            return f"refinement proposed: {e.summary}"
        case ev.RefinementFailed():
            return f"refinement failed: {e.reason}"
        case ev.RefinementSkipped():
            return f"refinement skipped: {e.rationale}"
        case ev.GoalStarted():
            return f"goal {e.goal_id}: {e.text}" + (f" (until `{e.check}` passes)" if e.check else " (autonomous)")
        case ev.GoalCheck():
            tail = e.output.strip().splitlines()[-6:]
            return ("goal check passed" if e.passed else f"goal check failed (exit {e.exit_code})") + (
                "\n" + "\n".join(tail) if tail and not e.passed else "")
        case ev.GoalContinued():
            left = ", ".join(f"{v:g} {k}" for k, v in e.budget_left.items())
            return f"goal: continuation {e.continuation}" + (f" ({left} left)" if left else "")
        case ev.GoalFinished():
            return f"goal {e.state} after {e.turns} turn(s): {e.reason}"
        case ev.ScheduleFired():
            return f"schedule {e.schedule_id}: {e.outcome}" + (f" ({e.reason})" if e.reason else "")
    return f"{e.type}: {e.model_dump_json(exclude={'seq', 'session_id', 'turn_id', 'ts', 'type'})}"
