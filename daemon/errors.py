"""What the daemon's sessions refuse, and why; the HTTP layer (daemon/app.py) picks each code's status."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi.responses import JSONResponse


class Refused(Exception):
    """A request the daemon refuses: `code` names why (see daemon.app.STATUS), `message` says it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def error_response(status: int, code: str, message: str) -> JSONResponse:
    """The API's error body, `{"error": {"code", "message"}}`. (FastAPI is imported here: the daemon's
    client, which every CLI command loads, needs `Refused` only, and importing FastAPI costs 0.12 s.)"""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
