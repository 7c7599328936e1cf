"""Real kernels for the agent's tests, as a session starts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kernel.bridge import BridgeServer
from agent.config_models import KernelConfig, SandboxConfig
from agent.kernel import Kernel
from agent.kernel.runtime import ENV_PATH, ENV_TOKEN


@pytest.fixture
async def make_kernel(project: Path, monkeypatch: pytest.MonkeyPatch):
    """Start a kernel with quick test limits, overridden by KernelConfig fields. `fd_capture`: True
    starts it without PYTEST_CURRENT_TEST (ipykernel captures file descriptors 1 and 2 then, as in
    production), False with it; None leaves the environment as pytest has it. `sandbox`: its mode (tests
    of process trees by pid run it unsandboxed: a sandbox's PID namespace numbers them otherwise)."""
    async def final(answer: str) -> None:
        return None

    bridges: list[BridgeServer] = []
    made: list[Kernel] = []

    async def ready(kernel_dir: Path) -> dict[str, str]:
        bridge = BridgeServer(kernel_dir, {"final": final})
        await bridge.start()
        bridges.append(bridge)
        return {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}

    async def make(fd_capture: bool | None = None, sandbox: str = "workspace-write", **config) -> Kernel:
        if fd_capture is True:
            monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
        elif fd_capture is False:
            monkeypatch.setenv("PYTEST_CURRENT_TEST", "kernel without fd capture")
        limits = {"cell_timeout": 30, "interrupt_grace": 1.0, "output_limit": 4096, **config}
        k = Kernel(project, KernelConfig(**limits), sandbox=SandboxConfig(mode=sandbox))
        made.append(k)
        await k.start(ready=ready)
        return k

    yield make
    for k in made:
        await k.shutdown()
    for bridge in bridges:
        await bridge.close()
