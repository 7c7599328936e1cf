"""What the daemon's sessions refuse, and why; the HTTP layer (daemon/app.py) picks each code's status."""

from __future__ import annotations


class Refused(Exception):
    """A request the daemon refuses: `code` names why (see daemon.app.STATUS), `message` says it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message
