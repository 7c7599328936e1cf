"""Sessions as notebooks (agent/notebook.py), with a real kernel and real matplotlib: a session exported
as .ipynb that nbformat validates, and a notebook's cells run as a session's starting point, through the
approval path the model's cells take."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nbformat
import pytest

from agent.config import home, load_config
from agent.notebook import Notebook, NotebookError, read_notebook
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import CellRecord, read_records
from cli.main import main
from tests.conftest import make_config

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('residuals')\nplt.show()"


async def test_an_exported_session_validates_with_its_cells_outputs_figure_subagent_and_conversation(project: Path):
    script = [cells("print('loading')", PLOT, "6 * 7", text="Let me plot it."),
              cells("print(await rlm.run('say hi', name='helper'))", "1/0"),
              "hi from the helper",  # the child's answer (it shares the script)
              "The line peaks at x=1."]
    async with Session(make_config(refine={"auto_every": 0}), ScriptedModel(script), cwd=project) as s:
        result = await s.prompt("plot the residuals and tell me what's wrong")
    assert result.outcome == "completed", result.error
    out = project.parent / "session.ipynb"
    assert main(["trajectory", "export", s.id, "--format", "ipynb", "-o", str(out)]) == 0  # the command a person runs

    nb = nbformat.read(out, as_version=4)
    nbformat.validate(nb)  # the file as written, read back
    assert nb.metadata.kernelspec.name == "python3"
    assert (nb.metadata.prime_agent.session_id, nb.metadata.prime_agent.model) == (s.id, "scripted")
    code = [c for c in nb.cells if c.cell_type == "code"]
    parent = [c for c in code if c.metadata.prime_agent.turn_id == "t1"]
    assert [c.source for c in parent] == ["print('loading')", PLOT, "6 * 7",
                                          "print(await rlm.run('say hi', name='helper'))", "1/0"]
    assert [c.execution_count for c in parent] == [1, 2, 3, 4, 5]
    assert parent[0].outputs == [nbformat.v4.new_output("stream", name="stdout", text="loading\n")]
    png, = [o for o in parent[1].outputs if o.output_type == "display_data"]
    assert base64.b64decode(png.data["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")  # the real figure
    assert parent[2].outputs[0].output_type == "execute_result" and parent[2].outputs[0].data["text/plain"] == "42"
    error = parent[4].outputs[-1]
    assert (error.output_type, error.ename) == ("error", "ZeroDivisionError") and "1/0" in "\n".join(error.traceback)
    # the conversation as markdown, in order around the cells; the child a headed section of its own
    kinds = [(c.cell_type, c.source.splitlines()[0] if c.source else "") for c in nb.cells]
    assert kinds[:2] == [("markdown", "## Prompt (t1)"), ("markdown", "Let me plot it.")]
    assert nb.cells[0].source.endswith("plot the residuals and tell me what's wrong")
    heading = next(i for i, c in enumerate(nb.cells) if c.source.startswith("### Subagent helper (completed"))
    assert nb.cells[heading + 1].source.startswith("#### Prompt") and "say hi" in nb.cells[heading + 1].source
    assert nb.cells[heading + 2].source == "hi from the helper"
    assert heading < kinds.index(("code", "1/0")) and kinds[-1] == ("markdown", "The line peaks at x=1.")


async def test_a_notebooks_cells_are_the_sessions_starting_point(project: Path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Data"), nbformat.v4.new_code_cell("data = [3, 1, 2]\nprint(len(data))"),
        nbformat.v4.new_code_cell("   "), nbformat.v4.new_code_cell(PLOT)])
    path = project / "analysis.ipynb"
    nbformat.write(nb, path)
    notebook = read_notebook(path)
    assert notebook.cells == ["data = [3, 1, 2]\nprint(len(data))", PLOT]
    model = ScriptedModel([cells("print(sorted(data))"), "sorted: [1, 2, 3]"])
    async with Session(make_config(), model, cwd=project) as s:
        loaded = await s.prompt(notebook.prompt(), notebook=notebook)
        assert (loaded.outcome, loaded.cells, loaded.steps) == ("completed", 2, 0)  # no model call
        answer = await s.prompt("sort the data")
    assert answer.answer == "sorted: [1, 2, 3]"
    told = model.calls[0][-2].content  # the notebook's report, then the prompt
    assert "ran the notebook analysis.ipynb in your kernel: 2 of its 2 code cells" in told
    assert "data = [3, 1, 2]" in told and "\n3\n" in told and "[display: image/png" in told
    assert model.calls[-1][-1].content == "[1, 2, 3]"  # the notebook's variable, in the agent's kernel
    ran = [r for r in read_records(s.layout.trajectory) if isinstance(r, CellRecord)]
    assert [r.cell.id for r in ran[:2]] == ["t1-notebook-1", "t1-notebook-2"] and ran[1].result.attachments


async def test_a_notebook_stops_at_its_first_failing_cell(project: Path):
    notebook = Notebook(name="broken.ipynb", cells=["x = 1", "1/0", "open('after', 'w')"])
    async with Session(make_config(), ScriptedModel([]), cwd=project) as s:
        r = await s.prompt(notebook.prompt(), notebook=notebook)
    assert r.outcome == "error" and r.error.startswith("cell 2 of broken.ipynb failed (ZeroDivisionError")
    assert "the 1 after it did not run" in r.error and not (project / "after").exists()
    assert "The 1 cell(s) after it did not run." in s.context.messages[-1].content


async def test_a_notebook_cell_goes_through_the_approval_path_the_models_take(project: Path):
    """The attack: a notebook (a file anyone could have written: the agent, a repository) whose cell a
    person's PreToolUse hook forbids. Loading it must not run that cell: a notebook is the person's
    input, but its cells are decided as the model's are."""
    (home() / "hooks.json").parent.mkdir(parents=True, exist_ok=True)
    (home() / "hooks.json").write_text(json.dumps({"hooks": {"PreToolUse": [{"matcher": "ipython", "hooks": [{
        "type": "command", "command": "python3 -c \"import json, sys; d = json.load(sys.stdin); "
        "(print('no writes outside', file=sys.stderr), sys.exit(2)) if 'owned' in d['tool_input']['code'] else 0\""}]}]}}))
    notebook = Notebook(name="evil.ipynb", cells=["print('harmless')", "open('owned', 'w').write('x')"])
    config = load_config(project, {"kernel": {"interrupt_grace": 1.0}})
    async with Session(config, ScriptedModel([]), cwd=project) as s:
        r = await s.prompt(notebook.prompt(), notebook=notebook)
    assert not (project / "owned").exists()
    assert r.outcome == "error" and "BlockedByHook" in (r.error or "") and "no writes outside" in r.error


@pytest.mark.parametrize("content, why", [
    ("{not json", "not a valid notebook"),
    (json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}), "no code cells"),
    (json.dumps({"cells": [{"cell_type": "code", "id": "r1", "source": "x <- 1", "metadata": {}, "outputs": [],
                            "execution_count": None}], "nbformat": 4, "nbformat_minor": 5,
                 "metadata": {"kernelspec": {"name": "ir", "display_name": "R", "language": "R"}}}), "R notebook"),
])
def test_a_notebook_that_cannot_run_here_says_why(tmp_path: Path, content: str, why: str):
    path = tmp_path / "x.ipynb"
    path.write_text(content)
    with pytest.raises(NotebookError, match=why):
        read_notebook(path)
    with pytest.raises(NotebookError, match="cannot read"):
        read_notebook(tmp_path / "missing.ipynb")
