"""The OS-facing part of a session: one real ipykernel per session (`manager`), started ahead of
time (`KernelPool`), confined by the OS (`sandbox`), its process trees reaped when their host is
gone (`reaper`), the host's end of the socket the kernel calls back on (`bridge`), and the code
that runs inside the kernel (`runtime/`, stdlib only).

Nothing here imports the session: the session composes these parts. The kernel process itself
imports `agent.kernel.runtime`, which runs this file first, so the public names below load only
when asked for (the runtime must not pull in jupyter_client or pydantic).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.config_models import SandboxConfig
    from agent.kernel.manager import Kernel, KernelError, KernelPool, KernelState

__all__ = ["Kernel", "KernelError", "KernelPool", "KernelState", "SandboxConfig"]
_HOME = {"Kernel": "agent.kernel.manager", "KernelError": "agent.kernel.manager", "KernelPool": "agent.kernel.manager",
         "KernelState": "agent.kernel.manager", "SandboxConfig": "agent.config_models"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'agent.kernel' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
