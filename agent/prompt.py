"""System prompt assembly: the immutable base prompt, the project's own instructions, then the
harness view (notes, skills, subagents and memories kept from earlier work).

Every model-facing text ships in the package as Markdown (agent/prompts/*.md: the base prompt,
compaction's, a subagent's role) and is rendered with strict substitution: a missing variable
is an error, never an empty hole.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template

from agent.config import Config, project_root


def _template(name: str) -> str:
    return resources.files("agent").joinpath("prompts", name).read_text(encoding="utf-8")


def render(template: str, /, **values: str) -> str:
    """agent/prompts/TEMPLATE.md with `$values` substituted strictly (a missing one is a KeyError)."""
    return Template(_template(f"{template}.md")).substitute(values).strip()


def base_prompt(cwd: Path, action_format: str, variant: str = "full") -> str:
    """agent/prompts/base.md, or with `variant="short"` short.md, with how to act in `action_format`."""
    if variant == "short":
        return render("short", action_format=_template(f"short_{action_format}.md").strip())
    return render("base", cwd=str(cwd), action_format=_template(f"{action_format}.md").strip())


def system_prompt(config: Config, cwd: Path, harness: str = "", instructions: str = "", mcp: str = "") -> str:
    """Base prompt, project instructions, the session's own instructions (a subagent's role), its
    MCP servers (agent.mcp.prompt_section), harness: what changes least comes first."""
    parts = [base_prompt(cwd, config.model.action_format, config.model.base_prompt).strip()]
    root = project_root(cwd)
    for name in config.project_instructions:
        path = root / name
        if path.is_file():
            parts.append(f"# Project instructions ({name})\n\n{path.read_text(errors='replace').strip()}")
    if instructions:
        parts.append(instructions.strip())
    if mcp:
        parts.append(mcp.strip())
    if harness:
        parts.append(harness.strip())
    return "\n\n".join(parts) + "\n"
