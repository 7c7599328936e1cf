"""The harness as a session uses it: in the system prompt, from the kernel, reloaded between turns."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from agent.events import Event
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import SystemPromptRecord, read_records
from harness_store.entries import HarnessError
from harness_store.skills import import_skills, skill_folders
from harness_store.store import Edit, HarnessStore
from tests.conftest import make_config
from tests.harness_store.published import font, publish


def system_of(call) -> str:
    return call[0].content


async def test_the_agent_edits_its_harness_and_the_next_turn_sees_it(project: Path):
    script = [
        cells("print(harness.create('memory', 'uses-uv', 'This project installs with uv.', title='Installs with uv'))"),
        "noted",
        cells("print(harness.list())", "print(harness.show('uses-uv'))"),
        "listed",
    ]
    events: list[Event] = []
    async with Session(make_config(), ScriptedModel(script), cwd=project, on_event=events.append) as s:
        await s.prompt("remember how we install")
        assert "in the prompt from the next turn" in s.model.calls[1][-1].content
        assert "uv" not in system_of(s.model.calls[1])  # not within the turn that made it
        await s.prompt("what do you know?")
    assert system_of(s.model.calls[2]) == system_of(s.model.calls[0])  # never rebuilt mid-session: the cache holds
    notice = s.model.calls[2][-1].content  # the next turn's prompt, with the change ahead of it
    assert "- added memory 'Installs with uv' [uses-uv] (session scope):\nThis project installs with uv." in notice
    assert notice.startswith("[The harness changed") and notice.endswith("what do you know?")
    listing, shown = s.model.calls[3][-2].content, s.model.calls[3][-1].content
    assert "memory   uses-uv" in listing and "[session]" in listing
    assert shown.startswith("[memory uses-uv, session scope]\n---\nid: uses-uv") and "source: agent" in shown
    store = HarnessStore(s.dir / "harness", "session")
    (change,) = [c for c in store.log() if c.entries == ["uses-uv"]]
    assert (change.trigger, change.trailers["Session"]) == ("agent", s.id)
    assert [e.type for e in events].count("harness.reloaded") == 1
    records = read_records(s.dir / "trajectory.jsonl")
    assert not any(isinstance(r, SystemPromptRecord) for r in records)
    assert records[0].harness_version == ""  # the harness was empty when the session began


async def test_harness_refusals_reach_the_model_as_errors(project: Path):
    script = [cells("harness.create('prompt', 'base_prompt', 'be evil')", "harness.show('nope')"), "ok"]
    async with Session(make_config(), ScriptedModel(script), cwd=project) as s:
        await s.prompt("try")
    refused, missing = s.model.calls[1][-2].content, s.model.calls[1][-1].content
    assert "HostError: ImmutableEntry: the base prompt ships with the package" in refused
    assert "NotFound: no harness entry 'nope'" in missing


async def test_skill_packages_import_in_the_kernel(project: Path, prime_home: Path):
    user = HarnessStore(prime_home / "harness", "user")
    user.apply([Edit("create", "greeter", kind="skill", title="Greeter", description="Greets people",
                     body="Call `greet.hello(name)`.", files={"greet/__init__.py": "def hello(n):\n    return f'hi {n}'\n"})],
               summary="add greeter", trigger="test", source="user")
    script = [
        cells("import greet; print(greet.hello('ada'))"),
        cells("harness.create('skill', 'adder', 'Call `adding.add`.', description='Adds', "
              "files={'adding/__init__.py': 'def add(a, b):\\n    return a + b\\n'})",
              "import adding; print(adding.add(2, 3))"),
        "done",
    ]
    async with Session(make_config(), ScriptedModel(script), cwd=project) as s:
        await s.prompt("use the skills")
    assert "- Greeter [greeter]: Greets people" in system_of(s.model.calls[0])
    assert s.model.calls[1][-1].content == "hi ada"
    assert s.model.calls[2][-1].content == "5"  # a skill made mid-session imports at once


async def test_a_persons_edit_during_a_session_reaches_the_next_turn(project: Path, prime_home: Path):
    user = HarnessStore(prime_home / "harness", "user")
    user.apply([Edit("create", "style", kind="prompt", title="Style", body="Use tabs.")],
               summary="add style", trigger="test", source="user")
    events: list[Event] = []
    async with Session(make_config(), ScriptedModel(["one", "two"]), cwd=project, on_event=events.append) as s:
        await s.prompt("first")
        path = prime_home / "harness/prompt/style.md"
        path.write_text(path.read_text().replace("Use tabs.", "Use four spaces."))
        for _ in range(100):
            if any(e.type == "harness.edited" for e in events):
                break
            await asyncio.sleep(0.05)
        await s.prompt("second")
    assert "Use tabs." in system_of(s.model.calls[0])
    assert system_of(s.model.calls[1]) == system_of(s.model.calls[0])  # the prefix holds; the change comes after it
    assert "- updated prompt note 'Style' [style] (user scope):\nUse four spaces.]\n\nsecond" in s.model.calls[1][-1].content
    edited = next(e for e in events if e.type == "harness.edited")
    assert (edited.scope, edited.entries, edited.problems) == ("user", ["style"], [])
    assert user.get("style").source == "user"


async def test_a_skills_script_opens_its_own_font_by_the_skills_path(project: Path, prime_home: Path, tmp_path: Path):
    published = publish(tmp_path / "published", cap=1 << 20)
    user = HarnessStore(prime_home / "harness", "user")
    import_skills(user, skill_folders(published), summary="import", session=None)
    script = [
        cells("import hashlib\np = harness.skill_path('canvas-kit')\n"
              "print(hashlib.sha256(open(f'{p}/canvas-fonts/Arsenal-Regular.ttf', 'rb').read()).hexdigest())",
              "import canvas_kit\nprint(canvas_kit.font_digest())",
              "import subprocess, sys\nprint(subprocess.run([sys.executable, '-m', 'scripts.render.measure'], cwd=p, "
              "capture_output=True, text=True, check=True).stdout.strip())",
              "print(subprocess.run([f'{p}/scripts/build.sh'], capture_output=True, text=True, check=True)"
              ".stdout.strip())",
              "harness.skill_path('nope')"),
        "done",
    ]
    async with Session(make_config(), ScriptedModel(script), cwd=project) as s:
        await s.prompt("use the canvas kit")
    assert "- canvas-kit [canvas-kit]: Make posters with the bundled fonts and templates" in system_of(s.model.calls[0])
    digest = hashlib.sha256(font()).hexdigest()
    by_path, imported, run, built, missing = (m.content for m in s.model.calls[1][-5:])
    assert (by_path, imported, run, built) == (digest, digest, digest, "built")
    assert "NotFound: no harness entry 'nope' in any scope" in missing


async def test_a_cells_edit_of_the_user_scope_waits_for_a_person_and_the_rules_refuse_a_secret(project: Path,
                                                                                               prime_home: Path):
    script = [
        cells("print(harness.create('memory', 'uses-uv', 'This project installs with uv.', scope='user'))",
              "harness.create('memory', 'key', 'api_key = sk-abcdefghijklmnopqrstuvwxyz0123', scope='project')"),
        "proposed",
    ]
    events: list[Event] = []
    async with Session(make_config(), ScriptedModel(script), cwd=project, on_event=events.append) as s:
        await s.prompt("remember it for every project")
    told, refused = s.model.calls[1][-2].content, s.model.calls[1][-1].content
    assert "not in force until a person accepts it" in told and "prime-agent harness review" in told
    assert "refused by the refiner's rules: policy: looks like a secret" in refused
    (pending,) = [e for e in events if e.type == "refinement.pending"]
    assert pending.scopes == ["user"] and "This project installs with uv." in pending.diff
    assert not (prime_home / "harness").exists() and not (project / ".prime-agent").exists()
    async with Session(make_config(), ScriptedModel(["hi"]), cwd=project) as fresh:
        await fresh.prompt("hello")
    assert "uv" not in system_of(fresh.model.calls[0])  # not in force in a new session

    async with Session(make_config(), ScriptedModel(["ok"]), cwd=project, session_id=s.id) as again:
        outcome = await again.decide_refinement(pending.id, approve=True)  # what the app's card does
    assert outcome.status == "applied"
    entry = HarnessStore(prime_home / "harness", "user").get("uses-uv")
    assert entry.source == "agent" and entry.body == "This project installs with uv.\n"
    async with Session(make_config(), ScriptedModel(["hi"]), cwd=project) as later:
        await later.prompt("hello")
    assert "### uses-uv [uses-uv] (by the agent)\nThis project installs with uv." in system_of(later.model.calls[0])


@pytest.mark.parametrize("sandbox", ["workspace-write", "full-access"])
async def test_a_planted_repository_in_the_project_scope_is_refused_and_its_hook_never_runs(project: Path,
                                                                                            tmp_path: Path,
                                                                                            sandbox: str):
    """A fresh project with no .prime-agent: the cell makes the project scope's repository itself, with
    a post-commit hook and an fsmonitor that dump the environment, then asks for a project entry. In
    workspace-write the sandbox's cover of the absent .prime-agent/ stops the planting; in full-access
    the host refuses the repository it did not make."""
    marker = tmp_path / "ran"
    (project / ".git").rmdir()
    plant = (f"%%bash\ngit init -q .prime-agent/harness && cd .prime-agent/harness\n"
             f"git config core.fsmonitor \"sh -c 'env > {project}/fsmonitor-env; touch {marker}'\"\n"
             f"printf '#!/bin/sh\\nenv > {project}/hook-env\\n' > .git/hooks/post-commit\n"
             "chmod +x .git/hooks/post-commit\n")
    script = [cells(plant, "print(harness.create('memory', 'm', 'x', scope='project'))"), "tried"]
    async with Session(make_config(sandbox={"mode": sandbox}), ScriptedModel(script), cwd=project) as s:
        await s.prompt("go")
        if sandbox == "full-access":
            assert s.harness.store("project").problem() is not None
            with pytest.raises(HarnessError):  # nor does a person's edit get committed there
                s.harness.store("project").commit_user_edits()
        else:
            assert not (project / ".prime-agent" / "harness" / ".git").exists()
    refused = "\n".join(m.content for m in s.model.calls[1] if m.role == "tool")  # both cells' output
    if sandbox == "full-access":
        assert "ForeignRepository: the project scope is refused" in refused and "post-commit" in refused
    else:
        assert "Read-only file system" in refused and "not in force until a person accepts it" in refused
    assert not marker.exists() and not (project / "hook-env").exists() and not (project / "fsmonitor-env").exists()
