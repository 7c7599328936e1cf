"""`prime_agent_py`: this project's agent as a verifiers (0.4) harness, so `vf-eval` (and prime-rl, and
anything else that runs verifiers tasksets) evaluates any taskset with it:

    vf-eval TASKSET --env.agent.harness.id prime_agent_py --env.agent.runtime.type subprocess --no-push

verifiers resolves a harness id as the module `verifiers.v1.harnesses.<id>`, else the installed module
`<id>` whose `__all__` exports the Harness: this package is that module. Its id is its own: verifiers'
built-in `prime_agent` installs another project (a TypeScript agent of the same name).

The harness is verifiers' own `ACPHarness`: verifiers' ACP runner starts `prime-agent acp` in the
rollout's runtime, pointed at the rollout's interception server (its endpoint as the model's base
URL, its per-rollout secret as the API key), so every model call the agent makes passes through
verifiers and lands in the rollout's trace. The task's prompt is the ACP prompt (its system prompt
in front of it, as verifiers does for every ACP agent); the agent's last message is the reply the
taskset's rewards score. The agent's session is an ordinary one of `$PRIME_AGENT_HOME` (in
`prime-agent sessions`, with its trajectory), its cwd the rollout's workspace, its kernel in the
agent's own OS sandbox. It imports nothing of ours: it starts a command.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field
from verifiers.v1.acp import ACPConfig, ACPHarness
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.runtimes import Runtime
from verifiers.v1.task import TaskData
from verifiers.v1.trace import Trace

__all__ = ["PrimeAgentPyHarness"]


def installed_command() -> list[str]:
    """`prime-agent acp` as installed beside the Python running verifiers (else on PATH)."""
    beside = Path(sys.executable).with_name("prime-agent")
    return [str(beside) if beside.exists() else shutil.which("prime-agent") or "prime-agent", "acp"]


class PrimeAgentPyConfig(HarnessConfig):
    command: list[str] = Field(default_factory=installed_command)
    """How the runtime starts the ACP agent. The default is the `prime-agent` installed beside this
    Python, which the subprocess runtime can run; in a container, a command that is there."""
    sandbox: Literal["read-only", "workspace-write", "full-access"] | None = None
    """The kernel's sandbox mode (None: the agent's configuration's, `workspace-write` by default)."""
    overrides: list[str] = Field(default_factory=list)
    """Configuration overrides, as `prime-agent acp --set KEY=VALUE` takes them, e.g.
    `model.action_format="text"` for a model without tool calling."""


class PrimeAgentPyHarness(ACPHarness[PrimeAgentPyConfig]):
    APPENDS_SYSTEM_PROMPT = True
    """The task's system prompt goes separately, and verifiers' runner puts it before the first prompt."""
    NEEDS_CONTAINER = False
    """The agent confines its kernel in an OS sandbox of its own (bubblewrap; docs/sandbox.md), so it
    may run in the subprocess runtime; verifiers still warns that host files can affect the run."""

    async def prepare_acp(self, ctx: ModelContext, trace: Trace, runtime: Runtime, endpoint: str, secret: str,
                          mcp_urls: dict[str, str], data: TaskData) -> ACPConfig:
        if self.config.disabled_tools:
            raise ValueError("prime-agent has one tool, its kernel (ipython): there is nothing to disable")
        system, prompt = self.resolve_prompt(data)
        command = [*self.config.command, "--model", ctx.model, "--base-url", endpoint]
        if self.config.sandbox:
            command += ["--sandbox", self.config.sandbox]
        for override in self.config.overrides:
            command += ["--set", override]
        # The secret is the key the agent gives its daemon for this endpoint (never the daemon's own).
        return ACPConfig(env={**self.config.resolved_env, "OPENAI_API_KEY": secret}, command=command,
                         prompt=prompt, system_prompt=system)
