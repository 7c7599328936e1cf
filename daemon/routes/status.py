"""GET /v1/status: the daemon itself."""

from __future__ import annotations

import os
import shutil
import time

from fastapi import APIRouter

from daemon.routes.common import VERSION, Manager, Server
from daemon.schemas import Status

router = APIRouter()


@router.get("/v1/status")
async def status(manager: Manager, served: Server) -> Status:
    return Status(
        pid=os.getpid(), version=VERSION, socket=served.socket, tcp=served.tcp.address,
        remote_unsandboxed=bool(served.tcp.address) and served.tcp.remote_unsandboxed,
        uptime=time.monotonic() - served.started, started=served.started_at, model_env=served.model_env,
        client_keys=sum(1 for s in manager.sessions.values() if s.models.key is not None),
        sessions=len(manager.sessions), live_sessions=manager.live(),
        running_turns=manager.running_turns(),
        pool_ready=manager.pool.ready, disk_free_mb=shutil.disk_usage(manager.root).free / 2**20,
        write_error=manager.write_error,
    )
