"""The web page's routes: the page and its files, the login, and POST /v1/web, the request a
`prime-agent web` holds open while it runs (docs/web.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from daemon.errors import Refused
from daemon.listeners import REMOTE
from daemon.routes.common import Manager, Server
from daemon.schemas import LoggedIn, OpenWeb, WebAccess, WebLogin

STATIC = Path(__file__).parent / "static"
MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
FILES = {p.relative_to(STATIC).as_posix(): p for p in STATIC.rglob("*") if p.is_file() and p.suffix in MEDIA}
"""What /static/ serves: the page's own files and its vendored libraries, nothing else."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
       "require-trusted-types-for 'script'; trusted-types dompurify")
"""No inline script, no other site's anything (a model's markdown image cannot carry data out), and
HTML reaches the page only through DOMPurify (Trusted Types: any other assignment of HTML throws)."""
KEEPALIVE = 15.0
"""Seconds between the empty lines that keep POST /v1/web's stream open."""

router = APIRouter()


@router.get("/", include_in_schema=False)
async def page() -> Response:
    return _file("index.html")


@router.get("/static/{name:path}", include_in_schema=False)
async def static(name: str) -> Response:
    if name not in FILES:
        raise Refused("not_found", f"no file {name!r} in the web page")
    return _file(name)


@router.post("/web/login", include_in_schema=False)
async def login(req: WebLogin, served: Server, response: Response) -> LoggedIn:
    """Trade the token `prime-agent web` printed for a login: an HttpOnly, SameSite=Strict cookie and
    the XSRF token the page sends beside it (X-Prime-Agent-Xsrf)."""
    found = served.tcp.logins.login(req.token)
    if found is None:
        raise Refused("bad_token", "this login token is not valid (any more): open the URL `prime-agent web` "
                      "prints (it is valid while that command runs)")
    cookie, xsrf, lease = found
    response.set_cookie(served.tcp.cookie, cookie, httponly=True, samesite="strict", path="/")
    return LoggedIn(xsrf=xsrf, cwd=lease.cwd)


@router.post("/web/logout", status_code=204, include_in_schema=False)
async def logout(request: Request, served: Server) -> Response:
    served.tcp.logins.logout(request.cookies.get(served.tcp.cookie, ""))
    response = Response(status_code=204)
    response.delete_cookie(served.tcp.cookie, path="/", httponly=True, samesite="strict")
    return response


@router.post("/v1/web", response_class=StreamingResponse,
             responses={200: {"content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/WebAccess"}}},
                              "description": "A WebAccess line, then an empty line every 15 s until the client "
                                             "leaves (the login ends) or the daemon stops (the stream ends)."}})
async def open_web(req: OpenWeb, request: Request, manager: Manager, served: Server) -> Response:
    """Serve the web page on `address` (the daemon's TCP listener, opened if need be) and mint a login
    token for it, both for as long as this request stays open: what `prime-agent web` holds. Over the
    Unix socket only (403 over TCP)."""
    if request.scope.get(REMOTE):
        raise Refused("unix_only", "POST /v1/web is for the daemon's Unix socket (prime-agent web)")
    address = await served.tcp.open(request.app, req.address)
    lease = served.tcp.logins.lease(req.cwd)

    async def end() -> None:
        served.tcp.logins.end(lease)
        await served.tcp.release()

    async def lines() -> AsyncIterator[str]:
        yield WebAccess(address=address, token=lease.token).model_dump_json() + "\n"
        quiet = 0.0
        while not manager.stopping:
            await asyncio.sleep(1.0)
            quiet += 1.0
            if quiet >= KEEPALIVE:
                yield "\n"
                quiet = 0.0

    return _Held(lines(), end)


class _Held(StreamingResponse):
    """A stream that runs `end` however it ends: finished, the client gone, or cancelled before it began."""

    def __init__(self, content: AsyncIterator[str], end: Callable[[], Awaitable[None]]):
        super().__init__(content, media_type="application/x-ndjson")
        self.end = end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.end()


def _file(name: str) -> Response:
    path = FILES[name]
    return Response(path.read_bytes(), media_type=MEDIA[path.suffix],
                    headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})
