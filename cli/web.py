"""`prime-agent web [--host 127.0.0.1] [--port 7433] [--no-browser]`: the web page, served by the
daemon (docs/web.md). Starts the daemon if need be, has it listen on HOST:PORT, prints the login URL
on a line of its own and opens a browser; the login lasts until Ctrl-C, and the daemon and its
sessions go on after it."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import webbrowser

from daemon.client import DaemonError, connect
from daemon.listeners import is_loopback


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only; another address is "
                   "reachable from the network, without TLS)")
    p.add_argument("--port", type=int, default=7433, help="the port (default 7433; 0: any free one)")
    p.add_argument("--no-browser", action="store_true", help="print the login URL, open no browser")


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\n[the page's login ended; the daemon and its sessions go on]", file=sys.stderr)
        return 0
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 1


async def _serve(args: argparse.Namespace) -> int:
    # Ctrl-C and SIGTERM end the login however this process began: one started with SIGINT ignored (a
    # script's background job, `nohup ... &`) would otherwise never hear it (Python keeps it ignored,
    # and asyncio.run only takes over a SIGINT left to Python's default).
    loop, serving = asyncio.get_running_loop(), asyncio.current_task()
    assert serving is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, serving.cancel)
    host = args.host.strip("[]")
    client = await connect(autostart=True)
    try:
        async for access in client.web(f"[{host}]:{args.port}" if ":" in host else f"{host}:{args.port}", os.getcwd()):
            port = int(access.address.rpartition(":")[2])
            url = login_url(host, port, access.token)
            print(url, flush=True)
            if not is_loopback(host):
                print(f"prime-agent: warning: the page listens on {host}, reachable from the network, without TLS: "
                      "the token, the login cookie and all the page shows travel unencrypted. Prefer the default "
                      f"127.0.0.1 with an SSH tunnel (ssh -L {port}:127.0.0.1:{port} THIS-MACHINE).",
                      file=sys.stderr)
            print("[open the URL above; Ctrl-C ends the login, the daemon and its sessions go on]", file=sys.stderr)
            if not args.no_browser:
                webbrowser.open(url)
    finally:
        await client.close()
    print("prime-agent: the daemon stopped; the page is gone", file=sys.stderr)
    return 1


def login_url(host: str, port: int, token: str) -> str:
    """The URL a browser logs in with (a wildcard address is reached by this machine's name)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/?token={token}"
