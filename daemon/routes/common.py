"""What every router shares: the manager a request is served by, what the app knows of the process
serving it, the TCP rule, and the error responses every route documents."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from agent.config import ENV_VARS
from daemon.errors import Refused
from daemon.listeners import REMOTE, WEB, TcpListener
from daemon.manager import SessionManager
from daemon.schemas import ErrorBody, ModelKey

VERSION = "0.1.0"
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 403, 404, 409, 413, 422, 429, 503)
}


def _model_env() -> dict[str, str]:
    return {var: "set" if var.endswith("_API_KEY") else os.environ[var] for var in ENV_VARS if os.environ.get(var)}


@dataclass(frozen=True)
class Served:
    """Where the app listens and what its TCP clients may do (`app.state.served`)."""

    tcp: TcpListener
    socket: str = ""
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    model_env: dict[str, str] = field(default_factory=_model_env)
    """The model settings the daemon's environment holds (the key only as "set")."""


async def _manager(request: Request) -> SessionManager:
    return request.app.state.manager


async def _served(request: Request) -> Served:
    return request.app.state.served


Manager = Annotated[SessionManager, Depends(_manager)]
"""A route's parameter: the manager of the app serving the request."""
Server = Annotated[Served, Depends(_served)]


def confined(request: Request) -> bool:
    """Whether this client is held to the sandbox the configuration says: it came over TCP with the
    bearer token (whoever holds it may be a kernel that read it), not as the web page `prime-agent
    web` logged in, and the daemon was not started with --allow-remote-unsandboxed."""
    return (bool(request.scope.get(REMOTE)) and request.scope.get(WEB) is None
            and not request.app.state.served.tcp.remote_unsandboxed)


def unix_only(key: ModelKey | None, request: Request) -> None:
    """A model key travels over the Unix socket only (a file only its user can open)."""
    if key is not None and request.scope.get(REMOTE):
        raise Refused("bad_request", "a model key is accepted over the daemon's Unix socket only, not over TCP: "
                      "set the key in the daemon's environment (OPENAI_API_KEY) or config.toml instead")
