"""The refine loop's exploit guard: the refiner may not write what only the held-out tasks know.

The lesson of an agent that scores without doing the task: a note that names a validation task,
repeats its prompt or holds its expected answer would raise the validation mean and teach nothing.
An edit (its id, title, description, content, metadata, skill file names and files) or a proposal
(summary, rationale, expected outcome) is refused when it holds, of a validation or test task:

- its id, as a whole token, where the id is not a plain word (it holds a digit or a sign: `k0-7`,
  `fix_3`; repo_fix's `add` or `mean` are words any note may use);
- a run of `NGRAM` words of its prompt, its files or its shell check (command and files), or the whole
  of such a text shorter than that (3 words at least);
- its expected answer (`answer`, reverse_text's `target`, the constants of a `.jsonl` Python check),
  3 characters at least, as a run of whole words.

Words are runs of letters and digits, lower-cased, so case, punctuation and spacing change nothing.
What a train task holds too (a template every prompt shares, a word all of them use) is what the
refiner saw and is never refused. Task files, checks and scorers are out of the refiner's reach by
construction: it writes harness entries and nothing else (docs/harness.md, "Measuring refinement").
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Iterator

from evals.env import Task
from harness_store.refiner import Proposal, ProposedEdit

NGRAM = 8
"""Words in a row of a held-out text that an edit may not repeat."""
MIN_WORDS = 3
"""A held-out text shorter than NGRAM words is refused whole, from this many words."""
MIN_ANSWER = 3
"""Characters an expected answer needs to be guarded (`42` or `no` is in any prose)."""
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def runs(ws: list[str], n: int) -> Iterator[tuple[str, ...]]:
    return (tuple(ws[i:i + n]) for i in range(len(ws) - n + 1))


def texts(task: Task) -> Iterator[tuple[str, str]]:
    """(what, text) of a task an agent or its check sees: prompt, files, a shell check's command and files."""
    yield "prompt", task.prompt
    if task.system:
        yield "prompt", task.system
    for path, text in task.files.items():
        yield f"file {path}", text
    check = task.data.get("check")
    if isinstance(check, dict) and "shell" in check:
        yield "check", str(check["shell"])
        for path, text in (check.get("files") or {}).items():
            yield f"check file {path}", str(text)


def answers(task: Task) -> Iterator[str]:
    """A task's expected answers, where its data holds them."""
    for key in ("answer", "target"):
        if isinstance(task.data.get(key), (str, int, float)) and not isinstance(task.data.get(key), bool):
            yield str(task.data[key])
    check = task.data.get("check")
    expr = check.get("python") if isinstance(check, dict) else check
    if isinstance(expr, str):
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            return
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) \
                    and not isinstance(node.value, bool):
                yield str(node.value)


class Guard:
    """What the held-out tasks alone know, and `violation(text)`: which of it a text holds."""

    def __init__(self, train: list[Task], held_out: list[Task]):
        seen = [words(t) for task in train for _, t in texts(task)] + [words(a) for task in train for a in answers(task)]
        known: dict[int, set[tuple[str, ...]]] = {}

        def new(run: tuple[str, ...]) -> bool:
            if len(run) not in known:
                known[len(run)] = {r for ws in seen for r in runs(ws, len(run))}
            return run not in known[len(run)]

        self.runs: dict[tuple[str, ...], tuple[str, str]] = {}
        """A run of words only held-out tasks hold -> (task id, what of it)."""
        for task in held_out:
            for what, text in texts(task):
                ws = words(text)
                for run in runs(ws, NGRAM) if len(ws) >= NGRAM else [tuple(ws)] if len(ws) >= MIN_WORDS else []:
                    if new(run):
                        self.runs.setdefault(run, (task.id, what))
            for answer in answers(task):
                ws = words(answer)
                if len(answer.strip()) >= MIN_ANSWER and ws:
                    for run in runs(ws, NGRAM) if len(ws) > NGRAM else [tuple(ws)]:
                        if new(run):
                            self.runs.setdefault(run, (task.id, "expected answer"))
        self.lengths = sorted({len(r) for r in self.runs})
        train_text = "\n".join([t for task in train for _, t in texts(task)] + [a for task in train for a in answers(task)])
        self.ids = {task.id: pattern for task in held_out
                    if re.search(r"[^a-zA-Z]", task.id) and len(task.id) >= MIN_ANSWER
                    and not (pattern := re.compile(rf"(?<![\w-]){re.escape(task.id.lower())}(?![\w-])")).search(
                        train_text.lower())}

    def violation(self, text: str) -> str | None:
        """Why `text` may not be written (it holds what only a held-out task knows), or None."""
        lowered = text.lower()
        for task_id, pattern in self.ids.items():
            if pattern.search(lowered):
                return f"exploit guard: names held-out task {task_id!r}"
        ws = words(text)
        for n in self.lengths:
            for run in runs(ws, n):
                if run in self.runs:
                    task_id, what = self.runs[run]
                    return f"exploit guard: holds held-out task {task_id!r}'s {what} ({' '.join(run)!r})"
        return None

    def edit(self, pe: ProposedEdit) -> str | None:
        return self.violation("\n".join(_strings(pe.model_dump(exclude={"action", "kind", "scope"}))))

    def proposal(self, p: Proposal) -> str | None:
        return self.violation("\n".join([p.summary, p.rationale, p.expected_outcome]))


def _strings(value: object) -> Iterable[str]:
    """Every string in a JSON-like value, keys included (a skill's file names)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif value is not None:
        yield value if isinstance(value, str) else json.dumps(value)
