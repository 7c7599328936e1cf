"""What the refine loop writes: each round's record (`rounds/NN/round.json`), the report
(`report.json`) and its figure (`refine.png`: the validation mean per round, kept and rejected
candidates marked, and the held-out test split before and after with 95% intervals)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class Val(BaseModel):
    before: float | None = None
    """The validation mean of the harness in force when the round began."""
    after: float | None = None
    """The candidate's (None: no candidate was evaluated)."""


class Refusal(BaseModel):
    id: str
    """The entry the refused edit named."""
    reason: str


class RoundRecord(BaseModel):
    round: int
    refinement_id: str | None = None
    kept: bool = False
    val: Val = Field(default_factory=Val)
    regressions: list[str] = Field(default_factory=list)
    """Validation tasks that passed with the harness in force and do not with the candidate."""
    reason: str = ""
    """Why it was kept or not, in numbers (no task is named: the refiner reads it in later rounds)."""
    tokens: int = 0
    """Model tokens the round spent: its train rollouts, its planning call, its candidate's validation
    (round 1 also the first harness's validation)."""
    cost: float = 0.0
    summary: str = ""
    edits: list[str] = Field(default_factory=list)
    """The entries the candidate changed."""
    refused: list[Refusal] = Field(default_factory=list)
    """Edits refused before evaluation: by the exploit guard, the refiner's rules or the store."""
    guard_refusals: int = 0
    """How many of `refused` the exploit guard refused."""
    unjudged: int = 0
    """Rollouts of the round that errored or timed out (they score 0)."""
    commit: str | None = None
    """The live scope's commit: the kept change, or the record of the rejection."""


class Mean(BaseModel):
    mean: float
    ci95: tuple[float, float]


class HeldOut(BaseModel):
    before: Mean
    after: Mean
    diff: float
    """Mean of after − before over the test tasks (the task is the unit)."""
    ci95: tuple[float, float]
    n: int
    per_task: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """Each test task's score (before, after)."""


class Report(BaseModel):
    taskset: str
    model: str
    scope: str
    """The harness scope the loop edited (`refine.default_scope`)."""
    seed: int
    splits: dict[str, list[str]]
    rounds: list[RoundRecord]
    test: HeldOut
    harness_before: str
    harness_after: str
    """Commits of the edited scope: the first harness and the last kept one (`eval --harness COMMIT`)."""
    tokens: int = 0
    cost: float = 0.0


def plot(report: Report, path: Path) -> None:
    """`refine.png`: the validation mean per round (the harness in force as a line; each candidate a mark,
    kept or rejected) beside the test split's mean before and after, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [5, 2]})
    rounds = report.rounds
    xs = [r.round for r in rounds]
    left.step([0, *xs], [rounds[0].val.before if rounds else 0.0, *[_in_force(r) for r in rounds]], where="post",
              color="0.4", label="harness in force")
    for kept, marker, colour, label in ((True, "o", "tab:green", "kept"), (False, "x", "tab:red", "rejected")):
        pts = [(r.round, r.val.after) for r in rounds if r.kept == kept and r.val.after is not None]
        if pts:
            left.scatter(*zip(*pts), marker=marker, color=colour, label=f"candidate {label}", zorder=3)
    left.set(xlabel="round", ylabel="validation mean", ylim=(-0.05, 1.05),
             title=f"{Path(report.taskset).name}: validation split, {len(report.splits['val'])} tasks")
    left.set_xticks([0, *xs])
    left.legend(loc="best", fontsize="small")
    t = report.test
    for x, held, colour in ((0, t.before, "0.4"), (1, t.after, "tab:blue")):
        right.errorbar([x], [held.mean], yerr=[[held.mean - held.ci95[0]], [held.ci95[1] - held.mean]], fmt="o",
                       color=colour, capsize=6)
    right.set(xticks=[0, 1], xticklabels=["before", "after"], xlim=(-0.6, 1.6), ylim=(-0.05, 1.05),
              ylabel="test mean", title=f"test split, n={t.n}\ndifference {t.diff:+.3f} [{t.ci95[0]:+.3f}, {t.ci95[1]:+.3f}]")
    right.title.set_fontsize("small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _in_force(r: RoundRecord) -> float:
    """The validation mean of the harness in force after round `r`."""
    return (r.val.after if r.kept else r.val.before) or 0.0
