"""The model-facing API inside the kernel.

`bootstrap()` runs in every new (or restarted) kernel and binds into the user namespace:
the file helpers (`read`, `write`, `edit`, `grep`, `glob`), `final(answer)`, `note(text)`,
`harness` (the agent's versioned notes, memories, skills and subagents), `rlm`, `llm` and
`agent_message` (subagents), `mcp` (the tools of the session's MCP servers), and `host`, the bridge to the session that owns this kernel. Standard library only, so a
kernel starts light.
"""

from __future__ import annotations

import os
import tempfile

from agent.kernel.runtime.bridge import Host, HostError
from agent.kernel.runtime.files import edit, glob, grep, read, write
from agent.kernel.runtime.harness import Harness, install_skill_finder
from agent.kernel.runtime.mcp import Mcp, McpError
from agent.kernel.runtime.streams import guard_streams
from agent.kernel.runtime.subagents import LLM, RLM, AgentMessage, SubagentError


class Refine:
    """`await refine.request(instructions=None)`: ask for a harness refinement from this session's
    evidence; it is planned in the background and applied at the next turn boundary."""

    def __init__(self, host: Host):
        self._host = host

    async def request(self, instructions: str | None = None) -> str:
        return await self._host.acall("refine.request", instructions=instructions)


class Ran:
    """What `request_permission` ran, once approved: `exit_code`, `stdout`, `stderr`."""

    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self) -> str:
        return f"{self.stdout}{self.stderr}[approved and run: exit code {self.exit_code}]"


ENV_PATH = "PRIME_AGENT_BRIDGE"
ENV_TOKEN = "PRIME_AGENT_BRIDGE_TOKEN"
ENV_SKILLS = "PRIME_AGENT_SKILL_DIRS"
ENV_SESSION_DIR = "PRIME_AGENT_SESSION_DIR"


def _interruptible_async_cells() -> None:
    """Let an interrupt stop a cell blocked in a top-level `await` (e.g. `await handle`).

    ipykernel 7.4 routes SIGINT during an async cell through a loop that is not the one running
    the cell, so the cell never stops and the kernel must be restarted (ipykernel#881). Cancel
    the cell's future on its own loop instead: the cell ends with CancelledError, state intact.
    """
    import contextlib
    import signal

    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or not hasattr(kernel, "_cancel_on_sigint"):
        return

    @contextlib.contextmanager
    def cancel_on_sigint(future):
        old = signal.signal(signal.SIGINT, lambda *_: future.get_loop().call_soon_threadsafe(future.cancel))
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)

    kernel._cancel_on_sigint = cancel_on_sigint


def bootstrap(namespace: dict, spill_after: int = 0) -> None:
    host = Host(os.environ[ENV_PATH], os.environ[ENV_TOKEN])
    # ipykernel asks subprocesses for colour (FORCE_COLOR, CLICOLOR_FORCE); escape codes are
    # noise to a model reading the output, so ask for plain text instead.
    for var in ("FORCE_COLOR", "CLICOLOR_FORCE", "CLICOLOR"):
        os.environ.pop(var, None)
    os.environ.update(NO_COLOR="1", TERM="dumb", PAGER="cat", GIT_PAGER="cat")
    install_skill_finder([d for d in os.environ.get(ENV_SKILLS, "").split(os.pathsep) if d])
    _interruptible_async_cells()
    guard_streams(spill_after)  # a cell that closes sys.stdout (or fd 1) does not leave the kernel mute

    def final(answer) -> None:
        """End the turn with `answer` (converted to text) as the final answer."""
        host.call("final", answer=answer if isinstance(answer, str) else repr(answer))

    async def request_permission(command: str, reason: str = "") -> Ran:
        """Ask the user to run the shell command `command` in the working directory, in a sandbox of
        its own with the workspace writable and, for a line of git commands, `.git/` too (`reason`:
        why it is needed). PermissionError if refused."""
        r = await host.acall("permission.request", command=command, reason=reason)
        if not r["approved"]:
            raise PermissionError(f"not approved: {r['reason']}")
        return Ran(r["exit_code"], r["stdout"], r["stderr"])

    def propose_plan(plan) -> None:
        """Plan mode: end the turn with `plan` (text) for the user to approve; once approved, the
        workspace is writable and you carry it out."""
        host.call("plan.propose", plan=str(plan))

    def note(text) -> None:
        """Show `text` to the user now, as a note event, without ending the turn."""
        host.call("note", text=str(text))

    namespace.update(
        host=host, HostError=HostError, final=final, note=note, propose_plan=propose_plan, request_permission=request_permission, harness=Harness(host),
        rlm=RLM(host, os.path.join(tempfile.gettempdir(), "contexts")), llm=LLM(host),
        agent_message=AgentMessage(host), SubagentError=SubagentError, refine=Refine(host),
        mcp=Mcp(host), McpError=McpError,
        read=read, write=write, edit=edit, grep=grep, glob=glob,
    )
