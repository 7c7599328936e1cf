"""`prime-agent harness ...` as a person uses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.session import Session
from agent.testing.openai_server import OpenAIServer, Reply
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import RefinementRecord, read_records
from harness_store.store import Edit, HarnessStore
from tests.conftest import make_config
from tests.harness_store.published import digests, publish

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PRIME_AGENT, "harness", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def skills(tmp_path: Path) -> Path:
    root = tmp_path / ".claude" / "skills"
    for name, desc in [("pdf-tools", "Extract text from PDFs"), ("csv-clean", "Clean CSV files")]:
        (root / name / "scripts").mkdir(parents=True)
        (root / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {desc}\nlicense: MIT\n---\n# {name}\nUse it.\n")
        (root / name / "scripts" / "run.py").write_text("print('ok')\n")
    return root


def test_import_list_show_log_diff_rollback(project: Path, prime_home: Path, skills: Path):
    imported = cli("import", str(skills), cwd=project)
    assert imported.returncode == 0, imported.stderr
    assert "2 skill(s) into the user scope [csv-clean, pdf-tools]" in imported.stdout
    assert (prime_home / "harness/skill/pdf-tools/scripts/run.py").read_text() == "print('ok')\n"

    store = HarnessStore(prime_home / "harness", "user")
    store.apply([Edit("create", "style", kind="prompt", title="Style", body="Tabs.")], summary="add style",
                trigger="user", source="user", refinement_id="r-style")
    store.apply([Edit("update", "style", body="Spaces.")], summary="spaces now", trigger="refine", source="refine",
                refinement_id="r-spaces")

    listed = json.loads(cli("list", "--json", cwd=project).stdout)
    assert {(r["id"], r["kind"], r["scope"]) for r in listed} == {
        ("pdf-tools", "skill", "user"), ("csv-clean", "skill", "user"), ("style", "prompt", "user")}
    shown = cli("show", "pdf-tools", cwd=project).stdout
    assert shown.startswith("# skill pdf-tools (user scope)\n---\nid: pdf-tools") and "license: MIT" in shown

    log = json.loads(cli("log", "--json", cwd=project).stdout)
    assert [c["refinement_id"] for c in log[:2]] == ["r-spaces", "r-style"]
    assert log[0]["entries"] == ["style"] and log[0]["trigger"] == "refine"
    text_log = cli("log", cwd=project).stdout.splitlines()
    assert "r-spaces" in text_log[0] and "spaces now" in text_log[0] and "[style]" in text_log[0]

    assert "-Tabs.\n+Spaces." in cli("diff", cwd=project).stdout
    assert "+Spaces." in cli("diff", "r-style", "r-spaces", cwd=project).stdout

    back = cli("rollback", "r-spaces", cwd=project)
    assert back.returncode == 0 and "rollback: spaces now [style]" in back.stdout
    assert store.get("style").body == "Tabs.\n"
    to = cli("rollback", "--to", log[-1]["commit"], "--json", cwd=project)
    assert json.loads(to.stdout)["trailers"]["Restores"] == log[-1]["commit"]
    assert json.loads(cli("list", "--json", cwd=project).stdout) == []


def test_errors_are_clear_and_change_nothing(project: Path, prime_home: Path, tmp_path: Path):
    missing = cli("rollback", "r-nope", cwd=project)
    assert missing.returncode == 2 and "no change 'r-nope' in the user scope" in missing.stderr
    assert cli("show", "nope", cwd=project).stderr.strip() == "prime-agent: no harness entry 'nope' in any scope"
    assert "needs --session ID" in cli("log", "--scope", "session", cwd=project).stderr
    bad = tmp_path / "bad" / "Bad Name"
    bad.mkdir(parents=True)
    (bad / "SKILL.md").write_text("---\nname: Bad Name\ndescription: x\n---\nbody\n")
    refused = cli("import", str(bad.parent), cwd=project)
    assert refused.returncode == 2 and "refused: invalid id 'Bad Name'" in refused.stdout
    assert refused.stderr == "prime-agent: no skill could be imported\n"
    assert not (prime_home / "harness/skill").exists()


def test_a_published_collection_imports_what_it_can_updates_exports_and_rolls_back(project: Path, prime_home: Path,
                                                                                    tmp_path: Path):
    cap = 512 * 1024
    prime_home.mkdir()
    (prime_home / "config.toml").write_text(f"[harness]\nmax_skill_file_bytes = {cap}\n")
    published = publish(tmp_path / "skills", cap=cap)

    dry = cli("import", str(published), "--dry-run", cwd=project)
    assert dry.returncode == 0 and dry.stdout.endswith("(dry run: nothing written)\n")
    assert not (prime_home / "harness").exists()
    table = cli("import", str(published), cwd=project)
    assert table.returncode == 0, table.stderr
    lines = [" ".join(ln.split()) for ln in table.stdout.splitlines()]
    assert lines[:3] == ["skill files size result", "canvas-kit 11 216.5 KB new",
                         "huge - - refused: data.bin: 524,289 B, over the cap of 524,288 B per file "
                         "(harness.max_skill_file_bytes)"]
    assert lines[3].startswith("linked - - refused: notes.md: a symlink pointing outside the skill folder (")
    assert lines[4:7] == ["long-api 1 73.2 KB new", "warning: the description has 1,100 characters, over the Agent "
                          "Skills limit of 1,024; the prompt view shows the first 1,024",
                          "piped - - refused: feed: a FIFO, not a regular file"]
    first = json.loads(cli("log", "--json", "-n", "1", cwd=project).stdout)[0]
    assert first["trigger"] == "import" and first["entries"] == ["canvas-kit", "long-api"]

    (published / "canvas-kit/showcase.pdf").write_bytes(b"%PDF-1.7\n%%EOF\n")
    again = json.loads(cli("import", str(published), "--json", cwd=project).stdout)
    assert {r["skill"]: r["status"] for r in again["rows"]} == {
        "canvas-kit": "updated", "huge": "refused", "linked": "refused", "long-api": "unchanged", "piped": "refused"}
    assert again["change"]["entries"] == ["canvas-kit"]
    assert "Binary files a/skill/canvas-kit/showcase.pdf and b/skill/canvas-kit/showcase.pdf differ" in \
        cli("diff", cwd=project).stdout

    out = project / ".agents/skills"
    exported = cli("export", "--kind", "skill", str(out), cwd=project)
    assert exported.returncode == 0, exported.stderr
    assert [" ".join(ln.split()) for ln in exported.stdout.splitlines()] == [
        "skill files size result", "canvas-kit 11 188.6 KB new", "long-api 1 73.2 KB new"]
    for name in ("canvas-kit", "long-api"):
        assert digests(out / name) == digests(published / name)  # byte for byte, SKILL.md included

    assert cli("rollback", again["change"]["refinement_id"], cwd=project).returncode == 0
    assert cli("rollback", first["refinement_id"], cwd=project).returncode == 0
    assert not (prime_home / "harness/skill").exists()
    nothing = cli("import", str(published / "huge"), cwd=project)
    assert nothing.returncode == 2 and "refused: data.bin" in nothing.stdout


def test_refine_a_finished_session_then_approve_it(project: Path, prime_home: Path):
    memory = {"action": "create", "kind": "memory", "id": "greeting", "title": "Greeting", "scope": "project",
              "content": "The user likes a short hello.", "reason": "the user said so in t1"}
    plan = json.dumps({"summary": "remember the greeting", "rationale": "stated by the user", "edits": [memory]})
    with OpenAIServer([Reply(content="hello"), Reply(content=plan)]) as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "PRIME_AGENT_MODEL": "m"}
        ran = subprocess.run([PRIME_AGENT, "run", "say hello, briefly"], cwd=project, capture_output=True, text=True, env=env)
        assert ran.returncode == 0, ran.stderr
        review = subprocess.run([PRIME_AGENT, "refine", "last", "--mode", "review"], cwd=project, capture_output=True,
                                text=True, env=env)
        assert server.requests[1]["response_format"] == {"type": "json_object"}
    assert review.returncode == 0, review.stderr
    rid = review.stdout.split()[0]
    assert "pending: remember the greeting" in review.stdout and "approve with: prime-agent refine approve" in review.stdout
    assert not (project / ".prime-agent/harness/memory/greeting.md").exists()
    session = next((prime_home / "sessions").iterdir()).name
    approved = subprocess.run([PRIME_AGENT, "refine", "approve", rid, "--session", session], cwd=project,
                              capture_output=True, text=True)
    assert approved.returncode == 0, approved.stderr
    assert "applied" in approved.stdout
    assert "The user likes a short hello." in (project / ".prime-agent/harness/memory/greeting.md").read_text()
    records = [r for r in read_records(prime_home / "sessions" / session / "trajectory.jsonl") if isinstance(r, RefinementRecord)]
    assert [r.status for r in records] == ["pending", "applied"]
    again = subprocess.run([PRIME_AGENT, "refine", "approve", rid, "--session", session], cwd=project,
                           capture_output=True, text=True)
    assert again.returncode == 2 and "no refinement" in again.stderr


async def test_the_agents_user_scope_entry_is_in_force_only_after_harness_review_accepts_it(project: Path,
                                                                                            prime_home: Path):
    script = [cells("harness.create('memory', 'uses-uv', 'This project installs with uv.', title='Installs with uv', "
                    "scope='user')"), "proposed"]
    async with Session(make_config(), ScriptedModel(script), cwd=project) as s:
        await s.prompt("remember it everywhere")
    listed = cli("review", cwd=project)
    assert listed.returncode == 0, listed.stderr
    rid, source, scopes = listed.stdout.split()[:3]
    assert (source, scopes) == ("agent", "user") and "agent: add memory uses-uv" in listed.stdout
    shown = cli("review", rid, cwd=project).stdout
    assert "create memory uses-uv (user scope)" in shown and "+ This project installs with uv." in shown
    assert json.loads(cli("list", "--json", cwd=project).stdout) == []  # not in force yet

    accepted = cli("review", rid, "--accept", cwd=project)
    assert accepted.returncode == 0, accepted.stderr
    assert f"{rid} applied: agent: add memory uses-uv" in accepted.stdout
    assert cli("review", cwd=project).stdout == ""
    entry = json.loads(cli("show", "uses-uv", "--json", cwd=project).stdout)
    assert (entry["scope"], entry["source"]) == ("user", "agent")
    (change, *_) = json.loads(cli("log", "--json", cwd=project).stdout)
    assert (change["refinement_id"], change["trigger"], change["summary"]) == (rid, "agent", "agent: add memory uses-uv")
    assert "+source: agent" in cli("diff", cwd=project).stdout
    async with Session(make_config(), ScriptedModel(["hi"]), cwd=project) as later:
        await later.prompt("hello")
    assert "### Installs with uv [uses-uv] (by the agent)\nThis project installs with uv." in later.model.calls[0][0].content
    assert cli("review", rid, "--reject", cwd=project).returncode == 2  # decided already
