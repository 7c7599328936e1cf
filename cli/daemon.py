"""`prime-agent daemon start [--foreground] [--tcp HOST:PORT [--allow-remote-unsandboxed]] | stop |
status [--json | --socket]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time

from agent.config import home
from daemon.client import Client, DaemonUnavailable, daemon_pid
from daemon.paths import run_dir, socket_file
from daemon.schemas import Status


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = actions.add_parser("start", help="start it (in the background, unless --foreground)")
    start.add_argument("--foreground", action="store_true", help="run in this terminal; Ctrl-C or SIGTERM stops it")
    start.add_argument("--tcp", metavar="HOST:PORT", help="also listen on TCP; requests need the bearer token")
    start.add_argument("--allow-remote-unsandboxed", action="store_true",
                       help="with --tcp: clients there may create sessions less confined than the configuration "
                       "says (full-access, network on, other MCP servers) and approve commands the sandbox "
                       "refused; without it only clients of the Unix socket may")
    start.add_argument("--no-schedules", action="store_true",
                       help="pause every schedule before the daemon starts (prime-agent schedule resume ID)")
    actions.add_parser("stop", help="stop it: running turns are interrupted and recorded first")
    status = actions.add_parser("status", help="pid, socket, version, uptime, sessions")
    status.add_argument("--json", action="store_true")
    status.add_argument("--socket", action="store_true",
                        help="print only the API's socket, running or not (curl --unix-socket \"$(prime-agent "
                             "daemon status --socket)\" ...)")


def main(args: argparse.Namespace) -> int:
    return {"start": _start, "stop": _stop, "status": _status}[args.action](args)


def _start(args: argparse.Namespace) -> int:
    from daemon.listeners import parse_tcp
    from daemon.server import AlreadyRunning, serve

    try:
        if args.tcp:
            parse_tcp(args.tcp)
        elif args.allow_remote_unsandboxed:
            raise ValueError("--allow-remote-unsandboxed goes with --tcp HOST:PORT")
    except ValueError as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    if daemon_pid() is not None:
        print(f"prime-agent: a daemon already runs for {home()} (pid {daemon_pid()})", file=sys.stderr)
        return 1
    if args.no_schedules:  # in the store it reads at start, before anything can fire
        from daemon.schedules import ScheduleStore, pause_all

        paused = pause_all(ScheduleStore(home()), "the daemon started with --no-schedules")
        print(f"[{len(paused)} schedule(s) paused: prime-agent schedule resume ID]", file=sys.stderr)
    if args.foreground:
        from evals.gate import gate_for

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for name in ("httpx", "httpx2", "openai"):  # a line per model request would bury what the daemon says
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            asyncio.run(serve(args.tcp, on_ready=lambda r: print(f"daemon ready: {json.dumps(r)}", flush=True),
                              gate_factory=gate_for, remote_unsandboxed=args.allow_remote_unsandboxed))
        except AlreadyRunning as e:
            print(f"prime-agent: {e}", file=sys.stderr)
            return 1
        return 0
    async def start() -> Status:
        async with Client() as client:
            await client.start_daemon(tcp=args.tcp, remote_unsandboxed=args.allow_remote_unsandboxed)
            return await client.status()

    try:
        status = asyncio.run(start())
    except DaemonUnavailable as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 1
    line = f"daemon running: pid {status.pid}, socket {status.socket}"
    if status.tcp:
        line += f", tcp {status.tcp} (bearer token in {run_dir() / 'token'})"
        if status.remote_unsandboxed:
            line += "; clients over TCP may loosen sandboxes (--allow-remote-unsandboxed)"
    print(line)
    return 0


def _stop(args: argparse.Namespace) -> int:
    pid = daemon_pid()
    if pid is None:
        print("prime-agent: the daemon is not running", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if daemon_pid() is None:  # its lock is free: it has exited
            print(f"daemon stopped (pid {pid})")
            return 0
        time.sleep(0.05)
    print(f"prime-agent: the daemon (pid {pid}) did not stop within 60 s", file=sys.stderr)
    return 1


def _status(args: argparse.Namespace) -> int:
    if args.socket:  # where it listens, or will: $PRIME_AGENT_HOME/run/daemon.sock, or a short path for a long one
        print(socket_file())
        return 0

    async def get() -> Status:
        async with Client() as client:
            return await client.status()

    try:
        status = asyncio.run(get())
    except DaemonUnavailable:
        if args.json:
            print(json.dumps({"running": False}))
        else:
            print("the daemon is not running", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"running": True, **status.model_dump()}, indent=2))
        return 0
    hours, rest = divmod(int(status.uptime), 3600)
    env = [f"{k}={v}" for k, v in status.model_env.items() if k != "OPENAI_API_KEY"]
    env.append("OPENAI_API_KEY set" if "OPENAI_API_KEY" in status.model_env else "no OPENAI_API_KEY")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.started))
    print(f"pid        {status.pid}\nversion    {status.version}\nsocket     {status.socket}\n"
          f"tcp        {status.tcp or '-'}{' (may loosen sandboxes)' if status.remote_unsandboxed else ''}\n"
          f"started    {started} (up {hours}h{rest // 60:02d}m{rest % 60:02d}s)\n"
          f"model      from its own environment at start ({', '.join(env)}) and config.toml;\n"
          f"           a session's key from the client that creates or prompts it, in memory only "
          f"({status.client_keys} session(s) have one)\n"
          f"sessions   {status.sessions} ({status.live_sessions} live, {status.running_turns} running)\n"
          f"pool       {status.pool_ready} kernels ready\n"
          f"disk       {status.disk_free_mb:,.0f} MB free" + (f"; a write failed at {status.write_error}"
                                                         if status.write_error else ""))
    return 0
