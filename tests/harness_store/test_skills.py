"""Agent Skills as people publish them: binary assets, long skills, a folder import that takes what
it can, re-imports, rollback of an import, and export back to a standard skills folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness_store.entries import MAX_ENTRY_CHARS, InvalidEntry, SkillLimits
from harness_store.skills import export_skills, import_skills, read_skill_folder, skill_folders
from harness_store.store import Edit, HarnessStore
from harness_store.view import HarnessView
from tests.harness_store.published import LONG_DESCRIPTION, digests, long_skill_md, publish

CAP = 512 * 1024
LIMITS = SkillLimits(max_file_bytes=CAP, max_skill_bytes=4 * CAP)


@pytest.fixture
def published(tmp_path: Path) -> Path:
    return publish(tmp_path / "skills", cap=CAP)


@pytest.fixture
def store(tmp_path: Path) -> HarnessStore:
    s = HarnessStore(tmp_path / "harness", "user", LIMITS)
    yield s


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def do_import(store: HarnessStore, src: Path, **kw):
    return import_skills(store, skill_folders(src), summary=f"import skills from {src}", **kw)


def test_a_folder_import_takes_every_valid_skill_and_refuses_the_rest_with_reasons(store: HarnessStore,
                                                                                  published: Path):
    report = do_import(store, published)
    rows = {r.id: r for r in report.rows}
    assert {k: r.status for k, r in rows.items()} == {
        "canvas-kit": "new", "huge": "refused", "linked": "refused", "long-api": "new", "piped": "refused"}
    assert rows["linked"].reason.startswith("notes.md: a symlink pointing outside the skill folder (")
    assert rows["huge"].reason == \
        "data.bin: 524,289 B, over the cap of 524,288 B per file (harness.max_skill_file_bytes)"
    assert rows["piped"].reason == "feed: a FIFO, not a regular file"
    assert rows["canvas-kit"].files == 11 and rows["long-api"].size == 75_000
    assert rows["long-api"].warnings == ["the description has 1,100 characters, over the Agent Skills limit of 1,024; "
                                         "the prompt view shows the first 1,024"]

    assert report.ok and report.change.entries == ["canvas-kit", "long-api"]  # one commit for both
    assert [c.trigger for c in store.log()] == ["import", "init"]
    kit = store.root / "skill/canvas-kit"
    source = digests(published / "canvas-kit")
    assert digests(kit).keys() == source.keys() and "scripts/render/measure.py" in source
    assert {rel: d for rel, d in digests(kit).items() if rel != "SKILL.md"} == \
        {rel: d for rel, d in source.items() if rel != "SKILL.md"}  # every asset byte for byte, exec bits too
    assert source["scripts/build.sh"][1]
    assert "100755 blob" in git(store.root, "ls-tree", "HEAD", "skill/canvas-kit/scripts/build.sh")
    assert not (kit / "scripts/__pycache__").exists() and not (store.root / "skill/linked").exists()
    fsck = subprocess.run(["git", "fsck", "--strict", "--no-progress"], cwd=store.root, capture_output=True, text=True)
    assert (fsck.returncode, fsck.stdout, fsck.stderr) == (0, "", "")
    assert git(store.root, "status", "--porcelain") == ""

    diff = store.diff()  # binary files get no text diff, even a PDF that looks like text to git
    assert "Binary files /dev/null and b/skill/canvas-kit/canvas-fonts/Arsenal-Regular.ttf differ" in diff
    assert "Binary files /dev/null and b/skill/canvas-kit/showcase.pdf differ" in diff
    crlf = subprocess.run(["git", "show", "HEAD:skill/canvas-kit/LICENSE.txt"], cwd=store.root, capture_output=True)
    assert crlf.stdout == (published / "canvas-kit/LICENSE.txt").read_bytes()  # no line-ending conversion

    long = store.get("long-api")  # a long skill is normal: its body, its description, its own metadata
    assert long.description == LONG_DESCRIPTION and long.metadata == {"license": "MIT", "metadata": {"version": "1.2"}}
    assert long.body == long_skill_md().split("---\n", 2)[2] and len(long.body) > MAX_ENTRY_CHARS


def test_the_prompt_view_shows_name_and_description_cut_to_the_format_limit(store: HarnessStore, published: Path):
    do_import(store, published)
    text = HarnessView([store]).render()
    skills = text[text.index("## Skills"):]
    assert "`harness.show(id)`" in skills and "`harness.skill_path(id)`" in skills
    assert f"- long-api [long-api]: {LONG_DESCRIPTION[:1024]}" in skills.splitlines()
    assert "- canvas-kit [canvas-kit]: Make posters with the bundled fonts and templates" in skills
    assert "## Endpoint 1" not in text  # the body is read on demand


def test_a_dry_run_shows_the_table_and_writes_nothing(store: HarnessStore, published: Path):
    report = do_import(store, published, dry_run=True)
    assert [r.status for r in report.rows if r.status != "refused"] == ["new", "new"] and report.change is None
    assert not store.root.exists()


def test_a_reimport_updates_the_changed_skills_in_one_commit(store: HarnessStore, published: Path):
    do_import(store, published)
    kit = published / "canvas-kit"
    font = bytearray((kit / "canvas-fonts/Arsenal-Regular.ttf").read_bytes())
    font[100] ^= 0xFF
    (kit / "canvas-fonts/Arsenal-Regular.ttf").write_bytes(bytes(font))
    (kit / "showcase.pdf").unlink()
    (kit / "templates").mkdir()
    (kit / "templates/poster.svg").write_text("<svg/>\n")

    again = do_import(store, published)
    assert {r.id: r.status for r in again.rows if r.status != "refused"} == \
        {"canvas-kit": "updated", "long-api": "unchanged"}
    assert again.change.entries == ["canvas-kit"] and len(store.log()) == 3
    diff = store.diff()
    assert "Binary files a/skill/canvas-kit/canvas-fonts/Arsenal-Regular.ttf and b/skill/canvas-kit/canvas-fonts/" \
           "Arsenal-Regular.ttf differ" in diff and "+<svg/>" in diff and "showcase.pdf" in diff
    assert digests(store.root / "skill/canvas-kit").keys() == digests(kit).keys()
    assert (store.root / "skill/canvas-kit/canvas-fonts/Arsenal-Regular.ttf").read_bytes() == bytes(font)

    unchanged = do_import(store, published)
    assert unchanged.ok and unchanged.change is None and len(store.log()) == 3


def test_rollback_of_an_import_removes_exactly_what_it_added(store: HarnessStore, published: Path):
    store.apply([Edit("create", "style", kind="prompt", title="Style", body="Tabs.")], summary="add style",
                trigger="test", source="user")
    def files() -> list[Path]:
        return sorted(p for p in store.root.rglob("*") if ".git" not in p.relative_to(store.root).parts)

    before_tree, before_files = git(store.root, "rev-parse", "HEAD^{tree}"), files()
    first = do_import(store, published)
    (published / "canvas-kit/scripts/build.sh").write_text("#!/bin/sh\necho rebuilt\n")
    second = do_import(store, published)
    middle_tree = git(store.root, "rev-parse", "HEAD~1^{tree}")

    store.rollback(second.change.refinement_id)
    assert git(store.root, "rev-parse", "HEAD^{tree}") == middle_tree  # the update undone, exec bit and all
    assert os.access(store.root / "skill/canvas-kit/scripts/build.sh", os.X_OK)
    store.rollback(first.change.refinement_id)
    assert git(store.root, "rev-parse", "HEAD^{tree}") == before_tree
    assert files() == before_files  # no file, no empty folder left behind
    assert store.get("style").body == "Tabs.\n"


def test_export_then_import_round_trips_every_skill_byte_for_byte(store: HarnessStore, published: Path,
                                                                   tmp_path: Path):
    store.apply([Edit("create", "csv-tools", kind="skill", title="CSV tools", description="Clean CSV files",
                      body="Call `csvtools.load`.", metadata={"license": "MIT"},
                      files={"csvtools/__init__.py": "def load(p):\n    return p\n"})],
                summary="agent skill", trigger="agent", source="agent")
    do_import(store, published)
    skills = [(e, store.skill_files(e.id)) for e in sorted(store.entries(), key=lambda e: e.id)]
    out = tmp_path / "project/.claude/skills"
    rows = export_skills(skills, out)
    assert [(r.id, r.status) for r in rows] == [("canvas-kit", "new"), ("csv-tools", "new"), ("long-api", "new")]
    for name in ("canvas-kit", "long-api"):  # what a person published comes back as it was, SKILL.md included
        assert digests(out / name) == digests(published / name)
    assert (out / "csv-tools/SKILL.md").read_text().startswith(
        "---\nname: csv-tools\ndescription: Clean CSV files\ntitle: CSV tools\nlicense: MIT\n---\n")

    fresh = HarnessStore(tmp_path / "fresh", "project", LIMITS)
    assert all(r.status == "new" for r in do_import(fresh, out).rows)
    for entry, files in skills:
        back = fresh.get(entry.id)
        assert (back.title, back.description, back.body, back.metadata) == \
            (entry.title, entry.description, entry.body, entry.metadata)
        assert fresh.skill_files(entry.id) == files
    again = tmp_path / "again"
    export_skills([(e, fresh.skill_files(e.id)) for e in fresh.entries()], again)
    assert digests(again) == digests(out)
    assert all(r.status == "unchanged" for r in do_import(store, out).rows)

    (out / "canvas-kit/extra.txt").write_text("mine\n")  # a folder that differs is not overwritten...
    assert export_skills(skills[:1], out)[0].reason == f"{out / 'canvas-kit'} exists and differs; --force replaces it"
    assert export_skills(skills[:1], out, force=True)[0].status == "updated"  # ...unless asked
    assert digests(out / "canvas-kit") == digests(published / "canvas-kit")
    assert export_skills(skills[:1], out)[0].status == "unchanged"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(out / "canvas-kit/scripts")
    (out / "canvas-kit/scripts").symlink_to(elsewhere)
    refused = export_skills(skills[:1], out, force=True)[0]
    assert refused.reason == f"{out / 'canvas-kit/scripts'} is a symlink; the export writes no file through it"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("case", ["folder link out", "dangling link", "link inside", "name not utf-8", "skill too big"])
def test_reading_a_skill_folder_refuses_only_what_is_unsafe_or_too_big(tmp_path: Path, case: str):
    skill = tmp_path / "s"
    skill.mkdir()
    (skill / "SKILL.md").write_text("---\nname: s\ndescription: d\n---\n")
    (skill / "a.bin").write_bytes(b"\x00" * 1000)
    if case == "folder link out":
        (tmp_path / "elsewhere").mkdir()
        (skill / "refs").symlink_to(tmp_path / "elsewhere")
        expected = "refs: a symlink pointing outside the skill folder ("
    elif case == "dangling link":
        (skill / "gone.txt").symlink_to(skill / "nothing")
        expected = "gone.txt: a symlink to nothing ("
    elif case == "link inside":
        (skill / "same.bin").symlink_to("a.bin")
        assert read_skill_folder(skill, LIMITS).files["same.bin"].data == b"\x00" * 1000  # kept as a copy
        return
    elif case == "name not utf-8":
        with open(os.path.join(os.fsencode(skill), b"caf\xe9.txt"), "wb") as f:
            f.write(b"x")
        expected = "caf\ufffd.txt: the file name is not UTF-8"
    else:
        (skill / "b.bin").write_bytes(b"\x01" * 1000)
        limits = SkillLimits(max_file_bytes=1500, max_skill_bytes=2000)
        with pytest.raises(InvalidEntry, match=r"^b.bin: the skill's files pass 2.0 KB, the cap per skill"):
            read_skill_folder(skill, limits)
        return
    with pytest.raises(InvalidEntry) as refused:
        read_skill_folder(skill, LIMITS)
    assert str(refused.value).startswith(expected)


def test_the_body_and_description_caps_hold_the_agent_and_the_refiner_not_a_person(store: HarnessStore):
    long = "x" * (MAX_ENTRY_CHARS + 1)
    with pytest.raises(InvalidEntry, match="the body has 32,769 characters; the limit is 32,768"):
        store.apply([Edit("create", "big", kind="skill", title="big", description="d", body=long)],
                    summary="agent", trigger="agent", source="agent")
    with pytest.raises(InvalidEntry, match="the description has 1,100 characters; the limit is 1,024"):
        store.apply([Edit("create", "big", kind="skill", title="big", description=LONG_DESCRIPTION)],
                    summary="refine", trigger="refine", source="refine")
    store.apply([Edit("create", "big", kind="skill", title="big", description=LONG_DESCRIPTION, body=long)],
                summary="a person's", trigger="import", source="user")
    store.apply([Edit("update", "big", title="Big")], summary="retitle", trigger="agent", source="agent")
    assert store.get("big").body == long + "\n"  # an agent edit that leaves a long body alone is fine


def test_a_persons_binary_file_is_committed_and_a_symlink_is_not(store: HarnessStore, tmp_path: Path):
    store.apply([Edit("create", "kit", kind="skill", title="kit", description="d")], summary="add", trigger="t",
                source="user")
    data = bytes(range(256)) * 64
    (store.root / "skill/kit/logo.png").write_bytes(data)
    (store.root / "skill/kit/leak").symlink_to(tmp_path)
    change, problems = store.commit_user_edits()
    assert change.entries == ["kit"] and store.skill_files("kit")["logo.png"].data == data
    assert problems == ["skill/kit/leak: a symlink; a skill keeps files, not links (copy the file in)"]


def test_a_scope_made_before_binary_skills_gets_its_gitattributes_on_the_next_write(store: HarnessStore):
    store.apply([Edit("create", "a", kind="memory", title="a")], summary="add a", trigger="t", source="user")
    git(store.root, "rm", "-q", ".gitattributes")
    git(store.root, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "as it was before")
    old = HarnessStore(store.root, "user")
    old.apply([Edit("update", "a", body="b")], summary="edit a", trigger="t", source="user")
    assert [c.summary for c in old.log(2)] == ["edit a", "harness: keep every file byte for byte"]
    assert "*.ttf binary" in (store.root / ".gitattributes").read_text()
