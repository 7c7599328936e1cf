"""Sessions as Jupyter notebooks (nbformat 4), and notebooks as a session's starting point.

Export (`to_notebook`): each prompt and each thing the model said is a markdown cell, each cell it
ran a code cell with its outputs as Jupyter writes them (`stream` for stdout and stderr,
`display_data` for each image or rich output, `execute_result`, `error` with its traceback), a
subagent a headed section with its own cells where it finished; the metadata name the kernel
(python3), the session and its model. `nbformat.validate` accepts what it writes.

Load (`read_notebook`): a notebook's code cells, in order, for a session to run in its kernel before
it goes on (`prime-agent run --notebook`, `/load` in the app): `Session.prompt(..., notebook=)` runs
them as one turn without a model call, each cell through the path the model's take (hooks, approvals,
sandbox), and the model is told what ran.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator

from agent.actions import FENCE
from agent.prompt import render
from agent.trajectory import (
    CellRecord,
    CompactionRecord,
    MessageRecord,
    Record,
    RewindRecord,
    SessionRecord,
    SubagentRecord,
    TurnFinishedRecord,
    TurnStartedRecord,
    read_records,
)
from agent.types import CellResult, Text

if TYPE_CHECKING:
    from nbformat import NotebookNode

MAX_BYTES = 50 * 1024 * 1024
"""The largest notebook file read (its images included)."""
MAX_CODE = 1_000_000
"""Characters of code a notebook may hand a session (a prompt's own limit)."""
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


class NotebookError(ValueError):
    """A notebook that cannot be read or run here; the message says why."""


class Notebook(BaseModel):
    """A notebook's code cells, as a session runs them before it goes on."""

    name: str = Field(min_length=1, max_length=300)
    """The file as the person named it (shown, and told to the model)."""
    cells: list[Text] = Field(min_length=1, max_length=10_000)

    @field_validator("cells")
    @classmethod
    def _bounded(cls, cells: list[str]) -> list[str]:
        if sum(map(len, cells)) > MAX_CODE:
            raise ValueError(f"over {MAX_CODE:,} characters of code")
        return cells

    def prompt(self) -> str:
        """The turn's prompt, as the person's message: what is run."""
        n = len(self.cells)
        return f"run the notebook {self.name}: its {n} code cell{'s' * (n != 1)}, in this session's kernel"


def read_notebook(path: Path, name: str | None = None) -> Notebook:
    """The code cells of the notebook at `path` (nbformat 4, or an older one converted), in order;
    NotebookError, saying why, for a file that is missing, too large, not a valid notebook, for
    another language than Python, or without code."""
    import nbformat

    try:
        size = path.stat().st_size
        if not path.is_file():
            raise NotebookError(f"{path} is not a file")
        if size > MAX_BYTES:
            raise NotebookError(f"{path} is {size:,} bytes, over the {MAX_BYTES:,} read")
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        nbformat.validate(nb)
    except OSError as e:
        raise NotebookError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, nbformat.ValidationError, AttributeError, KeyError) as e:  # bad JSON, bad schema
        raise NotebookError(f"{path} is not a valid notebook: {str(e).splitlines()[0][:200]}") from None
    language = (nb.metadata.get("kernelspec") or {}).get("language") or (nb.metadata.get("language_info") or {}).get(
        "name", "python")
    if str(language).lower() != "python":
        raise NotebookError(f"{path} is a {language} notebook; the session's kernel runs Python")
    cells = [c.source for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    if not cells:
        raise NotebookError(f"{path} has no code cells to run")
    if sum(map(len, cells)) > MAX_CODE or len(cells) > 10_000:
        raise NotebookError(f"{path} holds over {MAX_CODE:,} characters of code, or over 10,000 cells")
    return Notebook(name=(name or path.name)[:300], cells=cells)


def told(notebook: Notebook, results: list[CellResult]) -> str:
    """What the model is told once a notebook's cells ran: each cell's code and what it printed."""
    parts = [f"[cell {n}]\n```python\n{code.rstrip()}\n```\n{result.render()}"
             for n, (code, result) in enumerate(zip(notebook.cells, results), 1)]
    left = len(notebook.cells) - len(results)
    return render("notebook", name=notebook.name, ran=str(len(results)), of=str(len(notebook.cells)),
                  cells="\n\n".join(parts), left=f"\n\nThe {left} cell(s) after it did not run." if left else "")


# --- export -----------------------------------------------------------------------------------


def to_notebook(path: Path) -> NotebookNode:
    """The session whose trajectory is at `path` as an nbformat 4 notebook (validated)."""
    import nbformat

    records = read_records(path)
    session = next((r for r in records if isinstance(r, SessionRecord)), None)
    metadata: dict[str, Any] = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    if session is not None:
        metadata["prime_agent"] = {"session_id": session.session_id, "model": session.model, "cwd": session.cwd,
                                   **({"harness_version": session.harness_version} if session.harness_version else {})}
    nb = nbformat.v4.new_notebook(cells=_Cells(path).of(records, level=2), metadata=metadata)
    nbformat.validate(nb)
    return nb


class _Cells:
    """The cells of one session's records, its subagents' among them."""

    def __init__(self, path: Path):
        self.path = path
        self.count = 0

    def of(self, records: list[Record], level: int) -> list[NotebookNode]:
        from nbformat.v4 import new_markdown_cell

        cells: list[NotebookNode] = []
        said: dict[str | None, str] = {}  # the last thing the model said in each turn
        code_of_turn: dict[str | None, list[str]] = {}
        for r in records:
            if isinstance(r, TurnStartedRecord):
                cells.append(new_markdown_cell(f"{'#' * level} Prompt ({r.turn_id})\n\n{r.prompt}",
                                               metadata={"prime_agent": {"turn_id": r.turn_id}}))
            elif isinstance(r, MessageRecord) and r.message.role == "assistant":
                text = FENCE.sub("", r.message.content).strip()  # a text-mode cell is its code cell
                said[r.turn_id] = r.message.content.strip()
                if text:
                    cells.append(new_markdown_cell(text, metadata={"prime_agent": {"role": "assistant"}}))
            elif isinstance(r, CellRecord):
                code_of_turn.setdefault(r.turn_id, []).append(r.cell.code)
                cells.append(self.code_cell(r))
            elif isinstance(r, SubagentRecord):
                cells.extend(self.subagent(r, level + 1))
            elif isinstance(r, TurnFinishedRecord):
                if r.outcome != "completed":
                    why = f" ({r.error})" if r.error else ""
                    cells.append(new_markdown_cell(f"*The turn ended: {r.outcome}{why}*"))
                elif r.answer and r.answer.strip() != said.get(r.turn_id):
                    cells.append(new_markdown_cell(f"**Answer**\n\n{r.answer}"))
            elif isinstance(r, CompactionRecord):
                cells.append(new_markdown_cell(f"*The older context was summarised:*\n\n{r.summary}"))
            elif isinstance(r, RewindRecord):
                cells.append(new_markdown_cell(f"*Rewound to {'the end of' if r.after else 'before'} turn {r.turn} "
                                               f"({', '.join(r.parts)})*"))
        return cells

    def code_cell(self, r: CellRecord) -> NotebookNode:
        from nbformat.v4 import new_code_cell, new_output

        self.count += 1
        res, n = r.result, self.count
        outputs = [new_output("stream", name=name, text=text)
                   for name, text in (("stdout", res.stdout), ("stderr", res.stderr)) if text]
        outputs += [new_output("display_data", data={a.mime: _data(a.mime, a.data)}) for a in res.attachments]
        if res.result is not None:
            outputs.append(new_output("execute_result", data={"text/plain": res.result}, execution_count=n))
        if res.error_name:
            traceback = (res.traceback or f"{res.error_name}: {res.error_value}").rstrip("\n").split("\n")
            outputs.append(new_output("error", ename=res.error_name, evalue=res.error_value or "", traceback=traceback))
        if res.kernel_message:
            outputs.append(new_output("stream", name="stderr", text=f"[kernel] {res.kernel_message}\n"))
        meta = {"turn_id": r.turn_id, "cell_id": r.cell.id, "duration": round(res.duration, 3)}
        return new_code_cell(r.cell.code, execution_count=n, outputs=outputs, metadata={"prime_agent": meta})

    def subagent(self, r: SubagentRecord, level: int) -> list[NotebookNode]:
        """A child's section: a heading, then its own prompt, cells and answer (when its trajectory is there)."""
        from nbformat.v4 import new_markdown_cell

        heading = new_markdown_cell(f"{'#' * min(level, 6)} Subagent {r.name} ({r.outcome}, {r.duration:.1f}s)",
                                    metadata={"prime_agent": {"subagent": r.child_id}})
        here = self.path.parent / Path(r.dir).name / self.path.name  # beside its parent's, wherever that went
        child = here if here.is_file() else Path(r.dir) / self.path.name
        if not child.is_file():
            return [heading, new_markdown_cell(f"*Its trajectory is not at {child}.*")]
        return [heading, *_Cells(child).of(read_records(child), level + 1)]


def _data(mime: str, data: str) -> Any:
    """An attachment's data as a notebook keeps it: base64 for a binary image, text for SVG and text
    types, the value itself for JSON types."""
    if mime == "image/svg+xml":
        return base64.b64decode(data).decode("utf-8", errors="replace")
    if mime == "application/json" or mime.endswith("+json"):
        try:
            return json.loads(data)
        except ValueError:
            return data
    return data
