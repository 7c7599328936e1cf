"""The README and the reference: the README begins with the two commands, every relative link and
`#anchor` in README.md, docs/*.md and bench/README.md resolves (an anchor against GitHub's heading
slugs), every docs page is reachable from the README, and docs/configuration.md is what
scripts/config_docs.py writes from the config models."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
COMMANDS = ("bash scripts/setup.sh && .venv/bin/prime-agent demo\n"
            "bash scripts/setup.sh test && .venv/bin/python -m pytest -n 3 --dist loadfile\n")
"""The first two lines of the README's first code block, byte for byte."""

FENCE = re.compile(r"^(`{3,}|~{3,})[^`\n]*\n.*?^\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def prose(page: Path) -> str:
    """A page without its fenced code blocks, where nothing is a link or a heading."""
    return FENCE.sub("", page.read_text())


def anchors(page: Path) -> set[str]:
    """The `#anchor` of each heading as GitHub makes it: a link's text kept, lower case, punctuation
    other than `-` and `_` dropped, each space a `-`; a repeated one gets `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(prose(page)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def links(page: Path) -> list[str]:
    """Relative link targets of a page (web addresses left out)."""
    return [t for t in LINK.findall(prose(page)) if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t)]


def broken(pages: list[Path], root: Path) -> list[str]:
    """`page: target (why)` for each relative link that does not resolve inside `root`."""
    found = []
    for page in pages:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_relative_to(root):
                found.append(f"{page.name}: {target} (outside the repository)")
            elif not dest.exists():
                found.append(f"{page.name}: {target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                found.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
    return found


def test_the_readme_begins_with_the_two_commands() -> None:
    assert (ROOT / "README.md").read_text().startswith("# Prime Agent\n\n```bash\n" + COMMANDS + "```\n")


def test_every_link_and_anchor_resolves() -> None:
    assert broken(PAGES, ROOT) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    assert [p.name for p in PAGES[1:] if p not in linked] == []


def test_no_page_or_comment_points_outside_a_clone() -> None:
    """Issue 52: README and docs named the design page by a path in a `shared` folder beside the
    checkout, which a clone does not have (the design and the house style are docs/architecture.md and
    docs/style.md)."""
    files = [*PAGES, *(p for package in ("agent", "daemon", "tui", "cli", "evals", "rl", "harness_store", "tests")
                       for p in (ROOT / package).rglob("*.py"))]
    outside = re.compile(r"\.\./" + "shared/")  # split: this file names no such path either
    assert [str(p.relative_to(ROOT)) for p in files if outside.search(p.read_text())] == []
    assert (ROOT / "docs" / "architecture.md").is_file() and (ROOT / "docs" / "style.md").is_file()


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    """What the check stops: a page moved or renamed, a heading reworded, a link out of the repository;
    links in code blocks and to headings GitHub spells with punctuation, duplicates and links pass."""
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "a.md"
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Cost and the prompt cache\n\n## `[model]`\n\n"
                                            "## `[model]`\n\n## See [a](a.md)\n")
    page.write_text("# A\n\n[ok](b.md#cost-and-the-prompt-cache) [ok](b.md#model-1) [ok](b.md#see-a) "
                    "[ok](#a) [web](https://example.com/x.md#nothing)\n\n```\n[in code](gone.md)\n```\n\n"
                    "[gone](gone.md) [reworded](b.md#cost) [out](../../elsewhere.md) ![img](b.md#b)\n")
    assert broken([page], tmp_path) == [
        "a.md: gone.md (no such file)",
        "a.md: b.md#cost (no heading #cost in b.md)",
        "a.md: ../../elsewhere.md (outside the repository)",
    ]


def test_the_configuration_page_is_what_the_config_models_say() -> None:
    spec = importlib.util.spec_from_file_location("config_docs", ROOT / "scripts" / "config_docs.py")
    assert spec and spec.loader
    config_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_docs)
    assert config_docs.PAGE.read_text() == config_docs.render(), \
        "docs/configuration.md is stale: run `python scripts/config_docs.py` and commit it"
