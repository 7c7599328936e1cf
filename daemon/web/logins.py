"""Who may use the web page: one login token per running `prime-agent web`, and the browsers logged in
with it.

`prime-agent web` asks the daemon over its Unix socket (only the person can open it) for a `Lease`:
a fresh token, kept in the daemon's memory and printed only in that terminal. A browser trades it
(POST /web/login) for a cookie (HttpOnly, SameSite=Strict) and an XSRF token the page keeps in its
origin's storage; a request counts as the page's only with both. The bearer token in `run/token`
logs nothing in: whoever holds it (a script, or a kernel that read it) stays a remote client
(docs/web.md#who-the-page-is). When the `prime-agent web` that took the lease ends, its token and
every login made with it stop working.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

MAX_LOGINS = 64
"""Browsers logged in with one lease; past it the oldest login ends (memory stays bounded)."""


@dataclass(eq=False)
class Lease:
    """One `prime-agent web`'s login token, the folder it was started in (where the page's "New
    session" opens by default), and the logins made with it: sha256(cookie) -> XSRF token."""

    token: str
    cwd: str
    logins: dict[bytes, str] = field(default_factory=dict)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the lease ends: the page's open requests (its event streams) end with it."""


class Logins:
    def __init__(self) -> None:
        self.leases: list[Lease] = []

    def lease(self, cwd: str) -> Lease:
        lease = Lease(secrets.token_urlsafe(32), cwd)
        self.leases.append(lease)
        return lease

    def end(self, lease: Lease) -> None:
        """Its token and every login made with it stop working."""
        lease.logins.clear()
        lease.ended.set()
        if lease in self.leases:
            self.leases.remove(lease)

    def login(self, token: str) -> tuple[str, str, Lease] | None:
        """A new login (cookie, XSRF token, lease) for a live lease's token; None for any other."""
        given = token.encode()
        lease = next((x for x in self.leases if hmac.compare_digest(x.token.encode(), given)), None)
        if lease is None:
            return None
        cookie, xsrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        if len(lease.logins) >= MAX_LOGINS:
            del lease.logins[next(iter(lease.logins))]
        lease.logins[_digest(cookie)] = xsrf
        return cookie, xsrf, lease

    def check(self, cookie: str, xsrf: str) -> Lease | None:
        """The lease of a login whose cookie and XSRF token these are; None otherwise."""
        key = _digest(cookie)
        for lease in self.leases:
            expected = lease.logins.get(key)
            if expected is not None and hmac.compare_digest(expected.encode(), xsrf.encode()):
                return lease
        return None

    def logout(self, cookie: str) -> None:
        key = _digest(cookie)
        for lease in self.leases:
            lease.logins.pop(key, None)


def _digest(cookie: str) -> bytes:
    """Logins are looked up by the cookie's hash: no comparison that time could tell apart runs on the secret."""
    return hashlib.sha256(cookie.encode()).digest()
