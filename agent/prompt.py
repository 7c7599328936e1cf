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

from agent.config import home, project_root
from agent.config_models import Config
from agent.trust import TrustError, TrustStore


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
    parts += [f"# Project instructions ({name})\n\n{text.strip()}" for name, text in project_instructions(config, cwd)]
    if instructions:
        parts.append(instructions.strip())
    if mcp:
        parts.append(mcp.strip())
    if harness:
        parts.append(harness.strip())
    return "\n\n".join(parts) + "\n"


def project_instructions(config: Config, cwd: Path) -> list[tuple[str, str]]:
    """Each instruction file of the project (`project_instructions`) a person trusted as it is now,
    with its text: read once, never through a link (agent/trust.py); the others are left out, and
    named at the session's start (`Config.ignored`)."""
    root, store, out = project_root(cwd), TrustStore(home()), []
    for name in config.project_instructions:
        try:
            content = store.trusted(root, name)
        except (OSError, TrustError):  # unreadable: not in force (load_config named why)
            continue
        if content is not None:
            out.append((name, content.decode("utf-8", errors="replace")))
    return out
