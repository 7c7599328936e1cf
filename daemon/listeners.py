"""Where the daemon listens: uvicorn on its Unix socket and on at most one TCP address, whose gate
every request passes (the web page is served there: daemon/web/).

The TCP gate, in order:

1. **Host**: `localhost`, an IP address, the host the listener was bound to, or this machine's own
   name. Any other name is DNS rebinding (a page of another site whose name was pointed here): 403.
2. **Origin**: a request a browser says came from a page (`Origin`, `Sec-Fetch-Site`) must come from
   this origin (403 otherwise), and the page's own requests that change something always say so.
3. **Who**: `Authorization: Bearer <run/token>` is a remote client (`REMOTE`: it may not loosen a
   sandbox, docs/sandbox.md); the page's cookie with its XSRF header is the person who ran
   `prime-agent web` (`WEB`, daemon/web/logins.py). The page, its files and the login need neither;
   anything else is 401.

Every response over TCP says nosniff, no referrer, no framing and no caching.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import socket
from typing import Any

import uvicorn

from daemon.errors import Refused, error_response
from daemon.web.logins import Lease, Logins

REMOTE = "prime_agent.tcp"
"""Set in the ASGI scope of every request that came over TCP."""
WEB = "prime_agent.web"
"""Set in the ASGI scope of a request the web page made, logged in: its `Lease`."""
XSRF_HEADER = "x-prime-agent-xsrf"
PUBLIC = ("/", "/web/login")
"""Paths anyone reaching the listener may ask for (besides the page's files under /static/)."""
SAFE_METHODS = ("GET", "HEAD")
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY")]


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handlers: the daemon decides the order of shutdown."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def start_server(app: Any, sock: socket.socket) -> tuple[_Server, asyncio.Task]:
    """Serve `app` on `sock` (bound and listening); returns once it accepts connections."""
    server = _Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=5))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise RuntimeError("the daemon's listener did not start")
        await asyncio.sleep(0.01)
    return server, task


def parse_tcp(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--tcp wants HOST:PORT (e.g. 127.0.0.1:7433), not {text!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class TcpListener:
    """The daemon's one TCP listener: opened with the daemon (`--tcp`, kept until it stops) or by a
    `prime-agent web` that holds it open while it runs (closed when the last one ends)."""

    def __init__(self, token: str, limit: int, remote_unsandboxed: bool = False):
        self.token, self.limit = token, limit
        self.remote_unsandboxed = remote_unsandboxed
        """--allow-remote-unsandboxed: bearer clients may loosen a sandbox and act outside one."""
        self.logins = Logins()
        self.host, self.port = "", 0
        self.address: str | None = None
        """`host:port` as bound; None while closed."""
        self.kept = False
        self.holders = 0
        self._server: tuple[_Server, asyncio.Task] | None = None
        self._sock: socket.socket | None = None

    @property
    def cookie(self) -> str:
        """The login cookie's name: per port, since a browser sends a host's cookies to all its ports."""
        return f"prime_agent_web_{self.port}"

    async def open(self, app: Any, address: str, keep: bool = False) -> str:
        """Listen on `address` (port 0: any free one) unless already there; `keep`: until the daemon
        stops, else until `release`. 409 when it listens elsewhere or the address is taken."""
        host, port = parse_tcp(address)
        if self.address is None:
            try:
                sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
            except OSError as e:
                raise Refused("address_in_use", f"cannot listen on {address}: {e.strerror or e}") from None
            self.host, self.port = host, sock.getsockname()[1]
            self.address, self._sock = f"{host}:{self.port}", sock
            self._server = await start_server(TcpGate(BodyLimit(app, self.limit), self), sock)
        elif host != self.host or port not in (0, self.port):
            raise Refused("address_in_use", f"the daemon listens on TCP {self.address} already: use that address "
                          "(prime-agent web --host HOST --port PORT), or restart the daemon")
        if keep:
            self.kept = True
        else:
            self.holders += 1
        return self.address

    async def release(self) -> None:
        """A `prime-agent web` that held the listener open ended."""
        self.holders -= 1
        if self.holders <= 0 and not self.kept:
            await self.close()

    async def close(self) -> None:
        if self._server is None:
            return
        (server, task), self._server = self._server, None
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
        self.address, self.kept, self.holders = None, False, 0

    def host_allowed(self, name: str) -> bool:
        """Whether `name` (a Host header's, without its port) can only mean this machine."""
        name = name.lower().rstrip(".")
        if name in ("localhost", self.host.lower(), socket.gethostname().lower()):
            return True
        try:
            ipaddress.ip_address(name.strip("[]"))
            return True
        except ValueError:
            return False


class _Denied(Exception):
    def __init__(self, status: int, code: str, message: str):
        self.status, self.code, self.message = status, code, message


class TcpGate:
    """ASGI middleware of the TCP listener (the module's docstring says what it checks)."""

    def __init__(self, app: Any, listener: TcpListener):
        self.app, self.listener = app, listener

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def secured(message: dict) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [h for h in SECURITY_HEADERS if h[0] not in have]
                if b"cache-control" not in have:
                    extra.append((b"cache-control", b"no-store"))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            lease = self._check(scope, {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]})
        except _Denied as e:
            response = error_response(e.status, e.code, e.message)
            if e.status == 401:
                response.headers["WWW-Authenticate"] = "Bearer"
            return await response(scope, receive, secured)
        if lease is not None:
            receive = _until_ended(receive, lease)
        await self.app({**scope, REMOTE: True, WEB: lease}, receive, secured)

    def _check(self, scope: dict, headers: dict[str, str]) -> Lease | None:
        """The lease of the page's login, or None for a bearer client or a public path; _Denied otherwise."""
        host = headers.get("host", "")
        name = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
        if not host or not self.listener.host_allowed(name):
            raise _Denied(403, "bad_host", f"Host {host[:100]!r} is not this machine's: the daemon answers only to "
                          "localhost, an IP address or the name it listens on (a guard against DNS rebinding)")
        origin = headers.get("origin")
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            raise _Denied(403, "cross_origin", f"a request from the page {origin[:100]!r} is not from this daemon's")
        path, method = scope["path"], scope["method"]
        public = path in PUBLIC or path.startswith("/static/")
        if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none") and not (
                public and method in SAFE_METHODS):
            raise _Denied(403, "cross_origin", "a request from another site's page")
        scheme, _, given = headers.get("authorization", "").partition(" ")
        token = self.listener.token.encode()
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1"), token):
            return None
        if public:
            return None
        cookie = _cookie(headers.get("cookie", ""), self.listener.cookie)
        lease = self.listener.logins.check(cookie, headers.get(XSRF_HEADER, "")) if cookie else None
        if lease is None:
            raise _Denied(401, "unauthorized", "log in: open the URL `prime-agent web` prints; or send "
                          "`Authorization: Bearer <token>` (the token is in $PRIME_AGENT_HOME/run/token)")
        if method not in SAFE_METHODS and origin is None:
            raise _Denied(403, "cross_origin", "the page's requests that change something say their Origin")
        return lease


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def _until_ended(receive, lease: Lease):
    """`receive`, which says the client left once the lease ends: the page's event streams end with it."""

    async def wrapped() -> dict:
        get, ended = asyncio.ensure_future(receive()), asyncio.ensure_future(lease.ended.wait())
        await asyncio.wait({get, ended}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            ended.cancel()
            return get.result()
        get.cancel()
        return {"type": "http.disconnect"}

    return wrapped


class BodyLimit:
    """ASGI middleware: a request body past `limit` bytes gets 413 before the app sees any of it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._refuse(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        await error_response(413, "too_large", f"request bodies are limited to {self.limit} bytes")(scope, receive, send)
