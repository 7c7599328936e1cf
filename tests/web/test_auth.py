"""Who the daemon's TCP listener lets in, as attacks from where they would come: a client without a
token, a kernel holding the bearer token, another site's page, a DNS-rebinding page, a server elsewhere
on this machine that got the page's cookie, a browser after its `prime-agent web` ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from contextlib import closing, suppress

import httpx2
import pytest

from daemon.client import Client
from tests.conftest import SIGINT_IGNORED
from tests.web.conftest import Web

pytestmark = pytest.mark.timeout(120)


def _login(web: Web, token: str | None = None) -> tuple[httpx2.Client, str]:
    """A client logged in as the page is: its cookie, and the XSRF token the login answered."""
    h = httpx2.Client(base_url=web.base, headers={"Origin": web.base})
    r = h.post("/web/login", json={"token": token or web.url.split("token=")[1]})
    assert r.status_code == 200, r.text
    return h, r.json()["xsrf"]


def test_the_api_over_tcp_needs_a_login_or_the_token(web: Web):
    with httpx2.Client(base_url=web.base) as h:
        for path in ("/v1/sessions", "/v1/status", "/openapi.json", "/v1/sessions/x/events"):
            assert h.get(path).status_code == 401, path
        r = h.post("/v1/sessions", json={"cwd": str(web.project)})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert h.get("/v1/sessions", headers={"Authorization": "Bearer"}).status_code == 401
        assert h.post("/web/login", json={"token": "guess"}).status_code == 403
        assert h.get("/").status_code == 200  # the page itself holds nothing
        assert h.get("/static/app.js").status_code == 200
        assert h.get("/static/%2e%2e/router.py").status_code == 404
        assert h.get("/v1/sessions", headers={"Authorization": f"Bearer {web.bearer}"}).status_code == 200


def test_the_bearer_token_logs_no_page_in(web: Web):
    """A kernel that read run/token is a remote client, confined: it cannot become the page."""
    with httpx2.Client(base_url=web.base, headers={"Origin": web.base}) as h:
        r = h.post("/web/login", json={"token": web.bearer})
        assert r.status_code == 403 and r.json()["error"]["code"] == "bad_token"
        assert "set-cookie" not in r.headers


def test_a_cookie_alone_is_not_a_login(web: Web):
    """Browsers send a host's cookies to every port of it: a server a cell started on another port
    of localhost gets the page's cookie when the person opens a link to it. Without the XSRF token
    (which only the page's own origin can read) the cookie opens nothing."""
    h, xsrf = _login(web)
    with closing(h):
        cookie = h.cookies
        assert h.get("/v1/sessions", headers={"X-Prime-Agent-Xsrf": xsrf}).status_code == 200
        with httpx2.Client(base_url=web.base, cookies=cookie) as thief:
            assert thief.get("/v1/sessions").status_code == 401
            assert thief.get("/v1/sessions", headers={"X-Prime-Agent-Xsrf": "guess"}).status_code == 401
            r = thief.post("/v1/sessions", json={"cwd": str(web.project), "sandbox": "full-access"},
                           headers={"Origin": web.base})
            assert r.status_code == 401


def test_other_sites_pages_and_dns_rebinding_are_refused(web: Web):
    h, xsrf = _login(web)
    with closing(h):
        ok = {"X-Prime-Agent-Xsrf": xsrf}
        assert h.get("/v1/sessions", headers=ok).status_code == 200
        port = web.base.rsplit(":", 1)[1]
        for headers in ({"Origin": "http://evil.example"}, {"Origin": f"http://localhost:{int(port) + 1}"},
                        {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            r = h.get("/v1/sessions", headers={**ok, **headers})
            assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin", headers
        r = h.post("/v1/sessions", json={"cwd": str(web.project)}, headers={**ok, "Origin": "http://evil.example"})
        assert r.status_code == 403
        for host in ("evil.example", "rebind.attacker.example:" + port):  # a name pointed at 127.0.0.1
            r = h.get("/v1/sessions", headers={**ok, "Host": host, "Origin": f"http://{host}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "bad_host", host
            assert h.get("/", headers={"Host": host}).status_code == 403
        assert h.get("/v1/sessions", headers={**ok, "Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
                     ).status_code == 200
        with httpx2.Client(base_url=web.base, cookies=h.cookies) as no_origin:  # the page's changes say where from
            r = no_origin.post("/v1/sessions", json={"cwd": str(web.project)}, headers=ok)
            assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"


def test_a_login_ends_with_the_prime_agent_web_that_made_it(web: Web):
    """A second `prime-agent web` logs a browser in; Ctrl-C ends it (one started with SIGINT ignored
    too, as a script's background job is: `prime-agent web &`), and then its token and the browser's
    login open nothing, and the page's event stream ends."""
    second = subprocess.Popen([*SIGINT_IGNORED, sys.executable, "-m", "cli", "web", "--no-browser", "--port", "0"],
                              cwd=web.project, env={**os.environ, "PRIME_AGENT_HOME": str(web.home)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = second.stdout.readline().strip()
        assert url.startswith(f"{web.base}/?token="), url  # the listener the first one opened
        token = url.split("token=")[1]
        h, xsrf = _login(web, token)
        with closing(h):
            ok = {"X-Prime-Agent-Xsrf": xsrf}
            session = h.post("/v1/sessions", json={"cwd": str(web.project)}, headers=ok).json()
            events: list[bytes] = []
            streaming = threading.Event()

            def follow() -> None:
                with h.stream("GET", f"/v1/sessions/{session['id']}/events", headers=ok, timeout=None) as r:
                    with suppress(httpx2.RemoteProtocolError):  # cut: the daemon ended the response
                        for chunk in r.iter_bytes():
                            events.append(chunk)
                            streaming.set()

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            assert streaming.wait(30), "the page's event stream sent nothing"
            second.send_signal(signal.SIGINT)  # Ctrl-C
            assert second.wait(30) == 0, second.stderr.read()
            assert "the page's login ended" in second.stderr.read()
            follower.join(30)
            assert not follower.is_alive(), "the page's event stream outlived its login"
            assert h.get("/v1/sessions", headers=ok).status_code == 401
            assert h.post("/web/login", json={"token": token}).status_code == 403
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    with httpx2.Client(base_url=web.base) as other:  # the first one's login still works, its listener too
        assert other.get("/").status_code == 200


async def test_post_web_is_refused_over_tcp(web: Web):
    async with Client(url=web.base, token=web.bearer) as tcp:
        with pytest.raises(Exception) as e:
            await anext(tcp.web("127.0.0.1:0", "/"))
        assert getattr(e.value, "status", None) == 403


def test_the_login_is_a_strict_httponly_cookie_the_page_runs_no_inline_script_and_the_token_is_written_nowhere(web: Web):
    token = web.url.split("token=")[1]
    with httpx2.Client(base_url=web.base, headers={"Origin": web.base}) as h:
        r = h.post("/web/login", json={"token": token})
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and token.lower() not in cookie
        page = h.get("/")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self';" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert "<script>" not in page.text and " on" not in page.text.split("<body>")[1]  # no inline script
    written = [p for p in web.home.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert (web.home / "run" / "daemon.log").is_file()
    assert written == []  # nor in the daemon's log (run/daemon.log), nor in any record
