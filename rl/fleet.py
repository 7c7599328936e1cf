"""The inference servers rollouts come from (`train.rollout_urls`, or the one of `rollout_url`, or the
built-in policy server).

Each request goes to the least-loaded live server (fewest requests in flight). After every step each live
server loads the new weights, all at once; the step waits for all of them. A server that fails to load
them, or cannot be reached while another can, leaves the rotation: the failure is reported once
(`take_failures`) and sampling goes on with the rest. The last one left stays while it cannot be reached
(its rollouts count as errored); when no server loaded the new weights, training stops with an error.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class NoServerLeft(RuntimeError):
    """Every rollout server has left the rotation."""


@dataclass
class Server:
    url: str
    """Its OpenAI-compatible base URL (…/v1)."""
    reload_url: str
    """Where it loads new weights (reload, below)."""
    version: int
    """The policy version it was last given: stamped on rollouts whose reply names none (vLLM's)."""
    client: Any = field(repr=False)
    in_flight: int = 0
    requests: int = 0
    """Requests it answered."""
    failure: str | None = None
    """Why it left the rotation (None: live)."""


class Fleet:
    def __init__(self, urls: list[str], reload_urls: list[str] | None = None, version: int = 0,
                 timeout: float = 120.0, model: str = "policy"):
        import openai

        if not urls:
            raise ValueError("no rollout server")
        reload_urls = reload_urls or [u.rstrip("/") + "/reload" for u in urls]
        if len(reload_urls) != len(urls):
            raise ValueError(f"{len(urls)} rollout servers but {len(reload_urls)} reload URLs")
        self.timeout, self.model = timeout, model
        self.servers = [Server(u, r, version, openai.OpenAI(base_url=u, api_key="local", max_retries=2,
                                                              timeout=timeout))
                        for u, r in zip(urls, reload_urls)]
        self._unreachable = (openai.APIConnectionError,)
        self._timeout = openai.APITimeoutError  # a slow server stays: its rollouts count as timed out
        self._lock = threading.Lock()
        self._failures: list[str] = []

    @property
    def live(self) -> list[Server]:
        return [s for s in self.servers if s.failure is None]

    @property
    def url(self) -> str:
        """The base URL of a fleet of one (what samplers that talk to one server take)."""
        if len(self.servers) != 1:
            raise ValueError(f"{len(self.servers)} rollout servers where one is expected")
        return self.servers[0].url

    def call(self, request: Callable[[Any, Server], T]) -> tuple[T, Server]:
        """`request(client, server)` on the least-loaded live server; a server that cannot be reached leaves
        the rotation and the next is tried, unless it is the last. Timeouts and other errors are the caller's."""
        while True:
            with self._lock:
                live = self.live
                if not live:
                    raise NoServerLeft("every rollout server has left the rotation: "
                                       + "; ".join(f"{s.url}: {s.failure}" for s in self.servers))
                server = min(live, key=lambda s: s.in_flight)  # ties: the first listed
                server.in_flight += 1
            try:
                result = request(server.client, server)
                server.requests += 1
                return result, server
            except self._unreachable as e:
                if isinstance(e, self._timeout) or len(self.live) <= 1:
                    raise  # the last server stays: its rollouts count as failed, the next step tries it again
                self._retire(server, f"unreachable ({type(e).__name__}: {e})")
            finally:
                with self._lock:
                    server.in_flight -= 1

    def reload(self, path: Path, version: int) -> None:
        """Every live server loads the weights at `path` (in parallel; returns once all have answered). One that
        fails leaves the rotation; the others sample `version` from now on."""

        def one(server: Server) -> None:
            try:
                reload(server.reload_url, path, self.timeout, self.model)
            except Exception as e:  # refused, unreachable, timed out: it would sample stale weights
                self._retire(server, f"did not load step {version}'s weights ({type(e).__name__}: {e})")
            else:
                server.version = version

        live = self.live
        with ThreadPoolExecutor(len(live) or 1, thread_name_prefix="reload") as pool:
            list(pool.map(one, live))
        if not self.live:
            raise NoServerLeft("no rollout server loaded the new weights: "
                               + "; ".join(f"{s.url}: {s.failure}" for s in self.servers))

    def set_version(self, version: int) -> None:
        """The weights every server holds, when they were loaded some other way than `reload`."""
        for s in self.servers:
            s.version = version

    def take_failures(self) -> list[str]:
        """The servers that left the rotation since the last call, each as "URL: why"."""
        with self._lock:
            out, self._failures = self._failures, []
        return out

    def _retire(self, server: Server, why: str) -> None:
        with self._lock:
            if server.failure is None:
                server.failure = why
                self._failures.append(f"{server.url}: {why}")


def reload(url: str, path: Path, timeout: float, name: str = "policy") -> None:
    """Make the rollout server behind `url` sample from the weights at `path`; returns once it does. By the
    route `url` names:
    - `.../collective_rpc`: vLLM's (with VLLM_SERVER_DEV_MODE=1) reloads the model directory in place
      (`reload_weights`), then drops its prefix cache (`/reset_prefix_cache`: blocks of the old weights);
    - `.../load_lora_adapter`: vLLM's (with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) loads
      the adapter at `path` as `name`, replacing the one of that name;
    - anything else (the policy server's `/v1/reload`, a route of your own): POST {"path": ...}."""
    route = url.rstrip("/").rsplit("/", 1)[-1]
    if route == "collective_rpc":
        _post(url, {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}, path, timeout)
        _post(url.rstrip("/").removesuffix("collective_rpc") + "reset_prefix_cache", None, path, timeout)
    elif route == "load_lora_adapter":
        _post(url, {"lora_name": name, "lora_path": str(path), "load_inplace": True}, path, timeout)
    else:
        _post(url, {"path": str(path)}, path, timeout)


def _post(url: str, body: dict | None, path: Path, timeout: float) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else b"", method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
    except urllib.error.HTTPError as e:  # the server keeps its old weights: rollouts would silently go stale
        detail = e.read().decode(errors="replace")[:500]
        raise RuntimeError(f"{url}: the rollout server did not load {path}: {e.code} {detail}") from None
