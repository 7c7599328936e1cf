"""`prime-agent refine loop`: does a refinement make the agent better on tasks the refiner never saw?

    report = await RefineLoop(spec, config, model, run_dir, roots).run()

The task set's selection (what `prime-agent eval TASKSET -n TOTAL --seed S` runs) is cut into
disjoint splits: its first N tasks train, the next M validate, the next T test. Each round:

1. the train split runs with the harness in force;
2. the refiner plans from those rollouts alone (prompt, cells, answer and the check's verdict of
   each); the exploit guard (evals/refine_guard.py) refuses what only a held-out task knows;
3. the candidate, on a private copy of the harness, runs the validation split. It is kept only if
   the validation mean rises and no validation task that passed now fails (a tie is rejected): then
   it is committed to the live scope `refine.default_scope` names, with its provenance (trailers
   `Refinement-Id`, `Trigger: refine-loop`, `Round`, `Run`). A rejected one leaves the live harness
   as it was, and a commit that changes no entry records it and why in that scope's history.

At the end the test split runs with the first harness and the last one: a paired difference with
a 95% interval, the task as the unit. Every rollout is a fresh session in a fresh workspace, on a
private copy of the harness (every scope at the commit the loop measures), scored by the task
set's confined check (evals/scoring.py); its kernel reads neither the task set's file nor the
run folder's other records (`unseen`).

The run folder holds it all: `loop.json` (what was asked, the splits, every scope's first commit),
`val-0/` (the first harness on the validation split), `rounds/NN/train/`, `rounds/NN/plan.json`,
`rounds/NN/val/`, `rounds/NN/round.json` (written last: the round is over), `test/before/`,
`test/after/` (each an eval run), `report.json` and `refine.png`. Resumed, the loop redoes nothing
those files say was done, and finishes a round cut short after its commit landed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from agent.config_models import Config
from agent.context import transcript
from agent.model import Model
from agent.refine import check_skill, model_caller
from agent.trajectory import contexts, read_records
from agent.types import Completion
from evals.env import Task
from evals.refine_guard import Guard
from evals.refine_report import HeldOut, Mean, Refusal, Report, RoundRecord, Val, plot
from evals.runner import EvalSpec, Result, evaluate, prompt_of, read_results, rollout_layout
from evals.stats import interval, paired
from evals.tasksets import load_taskset
from harness_store.refiner import Outcome, Plan, RefinementError, Refiner
from harness_store.store import Change, HarnessStore, Scope
from harness_store.versions import check_out
from harness_store.view import HarnessView

if TYPE_CHECKING:
    from evals.cluster import Cluster

TRIGGER = "refine-loop"


class LoopError(ValueError):
    """The loop cannot go on (a scope changed behind it, a bad task set); the message says why."""


@dataclass
class LoopSpec:
    taskset: str
    rounds: int
    train: int
    val: int
    test: int
    seed: int = 0
    n: int | None = None
    """How many tasks to select (default: train + val + test); the splits are its first ones."""
    concurrency: int = 4
    timeout: float = 600.0


@dataclass
class Splits:
    train: list[Task]
    val: list[Task]
    test: list[Task]

    def ids(self) -> dict[str, list[str]]:
        return {"train": [t.id for t in self.train], "val": [t.id for t in self.val], "test": [t.id for t in self.test]}


def split(tasks: list[Task], spec: LoopSpec) -> Splits:
    """The first `train` tasks of the selection, the next `val`, the next `test`; disjoint by id."""
    need = spec.train + spec.val + spec.test
    if len(tasks) < need:
        raise LoopError(f"{spec.taskset} gives {len(tasks)} tasks (seed {spec.seed}); the splits need {need}")
    if len({t.id for t in tasks[:need]}) < need:
        raise LoopError(f"{spec.taskset}: task ids repeat within the selection, so the splits could share tasks")
    return Splits(tasks[:spec.train], tasks[spec.train:spec.train + spec.val], tasks[spec.train + spec.val:need])


class LoopState(BaseModel):
    """`loop.json`: what was asked and where the loop began, written before its first rollout."""

    spec: dict
    model: str
    base_url: str | None = None
    scope: Scope
    heads: dict[str, str | None]
    """Every scope's commit when the loop began: the other scopes stay there throughout."""
    splits: dict[str, list[str]]
    settings: dict = Field(default_factory=dict)
    """What the command line was given besides the spec (its `--set` overrides), for a resume."""


class Planned(BaseModel):
    """`rounds/NN/plan.json`: the refiner's plan (edits scoped and guarded), or why there is none."""

    plan: str | None = None
    error: str | None = None
    refused: list[Refusal] = Field(default_factory=list)
    guard_refusals: int = 0
    tokens: int = 0
    cost: float = 0.0


def score(r: Result) -> float:
    """A rollout's score: its reward; one that errored or timed out scores 0."""
    if r.outcome in ("passed", "failed"):
        return r.reward if r.reward is not None else float(r.outcome == "passed")
    return 0.0


def mean(results: list[Result]) -> float:
    return sum(map(score, results)) / len(results)


def decide(before: list[Result], after: list[Result]) -> tuple[bool, list[str], str]:
    """Keep the candidate? Only if the validation mean rises and no task that passed now fails."""
    now = {r.task_id: r for r in after}
    regressions = [r.task_id for r in before if r.outcome == "passed" and now[r.task_id].outcome != "passed"]
    b, a = sum(map(score, before)), sum(map(score, after))  # sums over the same tasks: no rounding in a tie
    moved = f"({mean(before):.3f} -> {mean(after):.3f})"
    problems = [] if a > b else [f"the validation mean {'fell' if a < b else 'did not rise'} {moved}"]
    if regressions:
        problems.append(f"{len(regressions)} validation task{'s' if len(regressions) > 1 else ''} that passed "
                        "before now fail")
    return not problems, regressions, " and ".join(problems) or f"the validation mean rose {moved}"


class RefineLoop:
    def __init__(self, spec: LoopSpec, config: Config, model: Model, run_dir: Path, roots: dict[Scope, Path], *,
                 settings: dict | None = None, say: Callable[[str], None] = lambda text: None,
                 cluster: Cluster | None = None):
        """`roots`: the live harness scopes (user, project); the loop edits `config.refine.default_scope`'s.
        `say`: a line of progress for a person. `cluster`: rollouts run as its Ray tasks (evals/cluster.py)."""
        self.cluster = cluster
        self.scope: Scope = config.refine.default_scope
        if self.scope == "session":
            raise LoopError("the refine loop edits a lasting scope: set refine.default_scope to project or user "
                            "(--set refine.default_scope=project)")
        self.spec, self.model, self.run_dir, self.say = spec, model, run_dir, say
        no_auto = config.refine.model_copy(update={"auto_every": 0})  # a rollout measures a harness, never edits it
        self.config = config.model_copy(update={"refine": no_auto})
        limits = config.harness.limits()
        self.stores = {s: HarnessStore(root, s, limits) for s, root in roots.items() if s != "session"}
        self.live = self.stores[self.scope]
        self.settings = settings or {}
        self.heads: dict[str, str | None] = {}
        """Every scope's commit when the loop began (`loop.json`)."""
        self.env = load_taskset(spec.taskset, scoring_sandbox=config.sandbox)
        named = Path(spec.taskset)
        self.task_file = [str(named.resolve())] if named.suffix in (".jsonl", ".py") and named.is_file() else []
        """The task set's own file (its prompts and checks), where it has one: no kernel of the loop reads it."""

    # --- the run ----------------------------------------------------------------------------------

    async def run(self) -> Report:
        state = self._begin()
        self.heads = state.heads
        splits = self._splits(state)
        guard = Guard(splits.train, splits.val + splits.test)
        before = current = state.heads[self.scope]
        assert current is not None
        val = await self._evaluate(splits.val, self.run_dir / "val-0", current)
        records: list[RoundRecord] = []
        for r in range(1, self.spec.rounds + 1):
            done = self._round_dir(r) / "round.json"
            if done.is_file():
                record = RoundRecord.model_validate_json(done.read_text())
            else:
                record = await self._round(r, splits, guard, current, val, records)
                _write(done, record.model_dump_json(indent=1))
            records.append(record)
            if record.kept:
                assert record.commit is not None
                current = record.commit
                val = read_results(self._round_dir(r) / "val" / "results.jsonl")
            self.say(f"round {r}: {'kept' if record.kept else 'rejected'}: {record.reason}")
        self.say("the test split, with the first harness and the last")
        first = await self._evaluate(splits.test, self.run_dir / "test" / "before", before)
        last = first if current == before else await self._evaluate(splits.test, self.run_dir / "test" / "after", current)
        tokens, cost = _spent(first, last)
        report = Report(taskset=self.spec.taskset, model=self.model.name, scope=self.scope, seed=self.spec.seed,
                        splits=state.splits, rounds=records, test=held_out(first, last), harness_before=before,
                        harness_after=current, tokens=tokens + sum(r.tokens for r in records),
                        cost=cost + sum(r.cost for r in records))
        _write(self.run_dir / "report.json", report.model_dump_json(indent=1))
        plot(report, self.run_dir / "refine.png")
        return report

    def _begin(self) -> LoopState:
        path = self.run_dir / "loop.json"
        if path.is_file():
            state = LoopState.model_validate_json(path.read_text())
            if state.scope != self.scope:
                raise LoopError(f"this run edits the {state.scope} scope; refine.default_scope now says {self.scope}")
            return state
        self.live.ensure()  # the scope's first commit: the harness the loop starts from has a version
        if (why := self.live.problem()) is not None:
            raise LoopError(why)
        self.live.commit_user_edits()  # a person's pending edit is part of the harness measured, in its history
        splits = split(self.env.tasks(self.spec.n or self.spec.train + self.spec.val + self.spec.test,
                                      seed=self.spec.seed), self.spec)
        state = LoopState(spec=asdict(self.spec), model=self.model.name, base_url=self.config.model.base_url,
                          scope=self.scope, heads={s: store.head() for s, store in self.stores.items()},
                          splits=splits.ids(), settings=self.settings)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _write(path, state.model_dump_json(indent=1))
        return state

    def _splits(self, state: LoopState) -> Splits:
        tasks = self.env.tasks(self.spec.n or self.spec.train + self.spec.val + self.spec.test, seed=self.spec.seed)
        splits = split(tasks, self.spec)
        if splits.ids() != state.splits:
            raise LoopError(f"{self.spec.taskset} no longer gives the tasks this run split (seed {self.spec.seed}): "
                            "it changed since the run began")
        return splits

    def _round_dir(self, r: int) -> Path:
        return self.run_dir / "rounds" / f"{r:02d}"

    # --- one round --------------------------------------------------------------------------------

    async def _round(self, r: int, splits: Splits, guard: Guard, current: str, val: list[Result],
                     records: list[RoundRecord]) -> RoundRecord:
        d = self._round_dir(r)
        landed = None  # a round cut short after its commit landed is finished, not redone
        if (d / "plan.json").is_file() and (plan_json := Planned.model_validate_json((d / "plan.json").read_text()).plan):
            landed = self._landed(Plan.from_json(plan_json).id)
        self._check_live(landed.commit if landed is not None and landed.entries else current)
        tokens, cost = _spent(val) if r == 1 else (0, 0.0)
        self.say(f"round {r}: the train split ({len(splits.train)} tasks)")
        with self._harness(current) as roots:
            train = await self._evaluate(splits.train, d / "train", current, roots)
            planned = await self._plan(d, roots, splits.train, train, guard, records)
        record = RoundRecord(round=r, val=Val(before=mean(val)), refused=planned.refused,
                             guard_refusals=planned.guard_refusals, unjudged=_unjudged(train))
        tokens, cost = tokens + _spent(train)[0] + planned.tokens, cost + _spent(train)[1] + planned.cost
        if planned.plan is None:
            record.reason = f"planning failed: {planned.error}"
        else:
            plan = Plan.from_json(planned.plan)
            record.refinement_id, record.summary = plan.id, plan.proposal.summary
            with self._harness(current) as roots:
                refiner = self._refiner(roots)
                outcome = await refiner.prepare(plan, mode="auto")
                record.refused += [Refusal(id=pe.id or "?", reason=why) for pe, why in outcome.refused]
                if outcome.status == "ready":  # on the copy: `outcome` stays ready for the live scope
                    applied = refiner.commit(Outcome(plan, "ready", outcome.applied, edits=outcome.edits))
                    if applied.status != "applied":
                        raise LoopError(f"the candidate could not be applied to a copy of the harness: {applied.reason}")
                    record.edits = [pe.id or "?" for pe in outcome.applied]
                    self.say(f"round {r}: the candidate ({plan.proposal.summary}) on the validation split")
                    after = await self._evaluate(splits.val, d / "val", current, roots, plan=plan.id)
                    tokens, cost = tokens + _spent(after)[0], cost + _spent(after)[1]
                    record.val.after, record.unjudged = mean(after), record.unjudged + _unjudged(after)
                    record.kept, record.regressions, record.reason = decide(val, after)
                else:
                    record.reason = (f"every edit was refused ({len(record.refused)})" if record.refused
                                     else "the proposal has no edits")
            if landed is None:
                self._check_live(current)  # nobody changed the live scope while the round ran
                landed = self._land(r, plan, outcome, record)
            record.commit = landed.commit
        record.tokens, record.cost = tokens, cost
        return record

    async def _plan(self, d: Path, roots: dict[Scope, Path], tasks: list[Task], train: list[Result], guard: Guard,
                    records: list[RoundRecord]) -> Planned:
        """The refiner's plan from the train rollouts alone, its edits in the loop's scope and guarded
        (`plan.json`: made once, even across a resume)."""
        path = d / "plan.json"
        if path.is_file():
            return Planned.model_validate_json(path.read_text())
        spent: list[Completion] = []
        refiner = self._refiner(roots, spent.append)
        view = HarnessView([HarnessStore(root, s) for s, root in roots.items()]).render()
        history = "\n".join(f"Round {r.round}: {'kept' if r.kept else 'rejected'}: {r.summary or '(no plan)'}: "
                            f"{r.reason}" for r in records)
        focus = _prompt("refine_loop.md").format(
            rollouts=len(train), history=f"\nEarlier rounds of this loop:\n{history}" if history else "")
        planned = Planned()
        try:
            plan = await refiner.plan(digest(tasks, train, d / "train", self.config.refine.window_chars), view,
                                      trigger=TRIGGER, instructions=focus)
        except RefinementError as e:  # the model's reply was no plan: a round without a candidate
            planned.error = str(e)
        else:
            edits = [pe.model_copy(update={"scope": self.scope}) for pe in plan.proposal.edits]
            whole = guard.proposal(plan.proposal)
            kept = []
            for pe in edits:
                why = whole or guard.edit(pe)
                if why is None:
                    kept.append(pe)
                else:
                    planned.refused.append(Refusal(id=pe.id or "?", reason=why))
            planned.guard_refusals = len(planned.refused)
            if whole:  # its summary is not written anywhere the refiner or a person's history reads
                plan.proposal.summary = "a proposal the exploit guard refused"
                plan.proposal.rationale = plan.proposal.expected_outcome = ""
            plan.proposal.edits = kept
            planned.plan = plan.to_json()
        planned.tokens = sum(c.usage.total_tokens for c in spent)
        planned.cost = sum(c.usage.cost for c in spent)
        d.mkdir(parents=True, exist_ok=True)
        _write(path, planned.model_dump_json(indent=1))
        return planned

    def _land(self, r: int, plan: Plan, outcome: Outcome, record: RoundRecord) -> Change:
        """The round's mark on the live scope: the kept change, or the record of the rejection."""
        trailers = {"Round": f"{r} of {self.spec.rounds}", "Run": str(self.run_dir.resolve())}
        if record.kept:
            landed = Refiner(self.stores, _no_planning, default_scope=self.scope).commit(
                Outcome(plan, "ready", outcome.applied, edits=outcome.edits), trailers=trailers)
            if landed.status != "applied" or landed.change is None:
                raise LoopError(f"the kept change could not be committed to the {self.scope} scope: {landed.reason}")
            return landed.change
        return self.live.record(f"rejected: {plan.proposal.summary} ({record.reason})",
                                {"Refinement-Id": plan.id, "Trigger": TRIGGER, **trailers})

    # --- harness copies and evaluations ------------------------------------------------------------

    @contextlib.contextmanager
    def _harness(self, commit: str) -> Iterator[dict[Scope, Path]]:
        """Private copies of every scope: the loop's at `commit`, the others where the loop began."""
        with tempfile.TemporaryDirectory(prefix="pa-loop-") as tmp:
            yield check_out(self.stores, {**self.heads, self.scope: commit}, Path(tmp))  # type: ignore[dict-item]

    async def _evaluate(self, tasks: list[Task], run_dir: Path, commit: str, roots: dict[Scope, Path] | None = None,
                        plan: str | None = None) -> list[Result]:
        """`tasks` on the harness at `commit` (with `plan` applied, when `roots` holds it); an errored
        rollout is run once more before it counts (as 0), and a split whose every rollout errored
        stops the loop."""
        if roots is None:
            with self._harness(commit) as roots:
                return await self._evaluate(tasks, run_dir, commit, roots)
        version = {self.scope: commit, **({"plan": plan} if plan else {})}
        spec = EvalSpec(self.spec.taskset, None, 1, self.spec.concurrency, self.spec.seed, self.spec.timeout, version)
        results: list[Result] = []
        for _ in range(2):
            results = await evaluate(spec, self._confined(run_dir), self.model, run_dir, harness_roots=roots,
                                     tasks=tasks, cluster=self.cluster)
            if not any(r.outcome == "error" for r in results):
                break
        if all(r.outcome == "error" for r in results):  # an outage measures nothing: stop, to resume later
            raise LoopError(f"every rollout of {run_dir.relative_to(self.run_dir)} errored, twice (the first: "
                            f"{results[0].error}); nothing was measured")
        return results

    def _refiner(self, roots: dict[Scope, Path], on_usage: Callable[[Completion], None] | None = None) -> Refiner:
        stores = {s: HarnessStore(root, s, self.config.harness.limits()) for s, root in roots.items()}
        return Refiner(stores, model_caller(self.model, self.config, on_usage), mode="auto", default_scope=self.scope,
                       check_skill=functools.partial(check_skill, sandbox=self._confined(None).sandbox))

    def _confined(self, eval_dir: Path | None) -> Config:
        """The config of a kernel the loop starts: the task set's file and the run folder covered (a
        Python check's verdict in a `results.jsonl` is its expression, the answer), but for the way down
        to a rollout's own session in `eval_dir` (whose sibling sessions its view covers). None: a
        kernel of no rollout (the refiner's skill check), the whole run folder covered."""
        hidden = [*self.config.sandbox.hidden, *self.task_file, *unseen(self.run_dir.resolve(), eval_dir)]
        return self.config.model_copy(update={"sandbox": self.config.sandbox.model_copy(update={"hidden": hidden})})

    def _landed(self, plan_id: str) -> Change | None:
        return next((c for c in self.live.log() if c.refinement_id == plan_id and c.trigger == TRIGGER), None)

    def _check_live(self, expected: str) -> None:
        """The live scope holds what the loop measured: no one changed it since (a person's edit would
        land beside the candidate unmeasured)."""
        self.live.commit_user_edits()
        if self.live.tree() != self.live.tree(expected):
            raise LoopError(f"the {self.scope} scope ({self.live.root}) changed outside the loop: it no longer "
                            f"holds {expected[:12]}, which the loop measured. Put it back (`prime-agent harness "
                            f"rollback`), or start a new run from the harness as it is now")


def digest(tasks: list[Task], results: list[Result], run_dir: Path, budget: int) -> str:
    """The train rollouts as the refiner reads them: each task's prompt, outcome and check's verdict,
    then the session's transcript (the newest of it within an even share of `budget` characters)."""
    prompts = {t.id: prompt_of(t) for t in tasks}
    share = max(2000, budget // max(1, len(results)))
    blocks = []
    for i, r in enumerate(results, 1):
        lines = [f"## Rollout {i} of {len(results)}: task {r.task_id}: {r.outcome}"
                 + (f" (reward {r.reward:.2f})" if r.reward is not None else ""),
                 f"Prompt: {prompts[r.task_id][:2000]}"]
        lines += [f"Check: {r.check[:600]}"] if r.check else []
        lines += [f"Error: {r.error[:600]}"] if r.error else []
        path = rollout_layout(run_dir, r).trajectory
        try:
            messages = (list(contexts(read_records(path))) or [[]])[-1]
        except (OSError, ValueError):
            messages = []
        first = next((k for k, m in enumerate(messages) if m.role == "user"), len(messages))
        lines.append(transcript(messages[first + 1:], per_message=share // 2, total=share) or "(no steps)")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def unseen(root: Path, inside: Path | None) -> list[str]:
    """The paths of the run folder `root` a kernel evaluating in `inside` is not to read (`sandbox.hidden`
    entries): every entry beside the way down to `inside/sessions`, and `inside/results.jsonl` (made
    before the first kernel starts, appended to while they run)."""
    if inside is None:
        return [f"{root}/"]
    inside, out, here = inside.resolve(), [], root
    for part in (*inside.relative_to(root).parts, "sessions"):
        if here.is_dir():
            out += [f"{p}/" if p.is_dir() else str(p) for p in sorted(here.iterdir()) if p.name != part]
        here = here / part
    return [*out, str(inside / "results.jsonl")]


def held_out(before: list[Result], after: list[Result]) -> HeldOut:
    """The test split's comparison: each harness's mean with its interval, and the paired difference."""
    now = {r.task_id: r for r in after}
    a, b = [score(r) for r in before], [score(now[r.task_id]) for r in before]
    diff, ci = paired(a, b)
    return HeldOut(before=Mean(mean=sum(a) / len(a), ci95=interval(a)), after=Mean(mean=sum(b) / len(b), ci95=interval(b)),
                   diff=diff, ci95=ci, n=len(a), per_task={r.task_id: (x, y) for r, x, y in zip(before, a, b)})


def _spent(*runs: list[Result]) -> tuple[int, float]:
    seen = {id(run): run for run in runs}.values()  # one run passed twice (the same harness before and after) counts once
    return sum(r.tokens for run in seen for r in run), sum(r.cost for run in seen for r in run)


def _unjudged(results: list[Result]) -> int:
    return sum(r.outcome in ("error", "timed_out") for r in results)


def _prompt(name: str) -> str:
    return resources.files("evals").joinpath("prompts", name).read_text(encoding="utf-8")


def _write(path: Path, text: str) -> None:
    """`path` replaced at once: a reader (a resume) finds the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _no_planning(messages, schema=None):
    raise RefinementError("the live harness is only committed to here; planning happens on a copy")

