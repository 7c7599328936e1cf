"""What the scripted servers of the native APIs share (agent/testing/anthropic_server.py,
agent/testing/responses_server.py): a threaded HTTP server that records each request (body and headers),
hands it to the API's `answer`, and writes JSON or server-sent events as the services do; and how the
services check the images a request carries."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

R = TypeVar("R")
SECRET = b"scripted-server"


def sign(text: str) -> str:
    """What the server issues for `text` (a thinking block's signature, an encrypted reasoning item), so
    that it can tell later whether a client sent it back unchanged."""
    return hmac.new(SECRET, text.encode(), hashlib.sha256).hexdigest()


class ScriptedServer(ABC, Generic[R]):
    path = ""
    """The one route POSTs go to (`/v1/messages`, `/v1/responses`)."""

    def __init__(self, script: list[R] | Callable[[dict[str, Any]], R], api_key: str | None = None):
        self._script, self.api_key = script, api_key
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        """Each request's headers, lower-cased names."""
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def __enter__(self) -> ScriptedServer[R]:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def next_reply(self, request: dict[str, Any]) -> R | None:
        with self._lock:
            if callable(self._script):
                return self._script(request)
            return self._script.pop(0) if self._script else None

    @abstractmethod
    def answer(self, http: _Handler, request: dict[str, Any], headers: dict[str, str]) -> None:
        """Answer one request as the service would (a subclass per API)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        server: ScriptedServer[Any] = self.server.owner  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != server.path:
            return self.json(404, {"error": {"message": f"no route {self.path}"}})
        try:
            request = json.loads(body)
        except ValueError:
            return self.json(400, {"error": {"message": "request body is not JSON"}})
        headers = {k.lower(): v for k, v in self.headers.items()}
        with server._lock:
            server.requests.append(request)
            server.headers.append(headers)
        server.answer(self, request, headers)

    def json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Server-sent events, each `event: NAME` and `data: JSON`, in chunks as they are written."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for name, data in events:
            chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


IMAGE_TYPES = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff", "image/gif": b"GIF8",
               "image/webp": b"RIFF"}
"""The image types the services take, and how each one's bytes begin."""


def image_problem(mime: str, data: Any) -> str | None:
    """What is wrong with an image sent as `mime` and base64 `data` (the services refuse it), if anything."""
    if mime not in IMAGE_TYPES:
        return f"unsupported image type {mime!r}: only {', '.join(IMAGE_TYPES)}"
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else b""
    except binascii.Error:
        return "invalid base64 data"
    actual = next((t for t, magic in IMAGE_TYPES.items() if raw.startswith(magic)), None)
    if actual != mime:
        return f"the image was specified using the {mime} media type, but it appears to be {actual or 'no image'}"
    return None


def data_url_problem(url: Any) -> str | None:
    """What is wrong with an image sent as a data URL (`data:image/png;base64,...`), if anything."""
    head, comma, data = str(url).partition(",")
    if not (comma and head.startswith("data:") and head.endswith(";base64")):
        return "expected a base64-encoded data URL with an image MIME type (e.g. 'data:image/png;base64,...')"
    return image_problem(head[len("data:"):-len(";base64")], data)


def pieces(text: str, size: int = 8) -> list[str]:
    """`text` in the small pieces a stream sends it in."""
    return [text[i:i + size] for i in range(0, len(text), size)]
