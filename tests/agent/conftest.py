"""Real kernels for the agent's tests, as a session starts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.bridge import BridgeServer
from agent.config import KernelConfig
from agent.kernel import Kernel
from agent.runtime import ENV_PATH, ENV_TOKEN


@pytest.fixture
async def make_kernel(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Start a kernel with quick test limits, overridden by KernelConfig fields. `fd_capture`: True
    starts it without PYTEST_CURRENT_TEST (ipykernel captures file descriptors 1 and 2 then, as in
    production), False with it; None leaves the environment as pytest has it."""
    async def final(answer: str) -> None:
        return None

    bridge = BridgeServer(tmp_path / "run", {"final": final})
    await bridge.start()
    made: list[Kernel] = []

    async def make(fd_capture: bool | None = None, **config) -> Kernel:
        if fd_capture is True:
            monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
        elif fd_capture is False:
            monkeypatch.setenv("PYTEST_CURRENT_TEST", "kernel without fd capture")
        limits = {"cell_timeout": 30, "interrupt_grace": 1.0, "output_limit": 4096, **config}
        env = {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}
        k = Kernel(project, tmp_path / "run", KernelConfig(**limits), env)
        made.append(k)
        await k.start()
        return k

    yield make
    for k in made:
        await k.shutdown()
    await bridge.close()
