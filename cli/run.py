"""`prime-agent run TASK`: one headless session; prints the final answer.

Exit codes: 0 completed, 2 bad configuration or usage, 3 model error, 4 budget exhausted,
5 model timed out, 130 interrupted. Ctrl-C interrupts the running cell (the kernel keeps its
state) and ends the turn; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from agent.approvals import Decision, Request
from agent.config import Config, ConfigError, load_config, merge, parse_override
from cli.follow import EXIT_CODES, follow, on_ctrl_c, report
from cli.show import Printer, print_json

EXIT_CONFIG = 2

NO_MODEL = """\
prime-agent: no model configured.
Point it at any OpenAI-compatible server:
  OpenAI      export OPENAI_API_KEY=sk-... PRIME_AGENT_MODEL=gpt-4.1
  vLLM        export OPENAI_BASE_URL=http://localhost:8000/v1 PRIME_AGENT_MODEL=<served model name>
  Ollama      export OPENAI_BASE_URL=http://localhost:11434/v1 PRIME_AGENT_MODEL=qwen2.5-coder
  llama.cpp   export OPENAI_BASE_URL=http://localhost:8080/v1 PRIME_AGENT_MODEL=local
  OpenRouter  export OPENAI_BASE_URL=https://openrouter.ai/api/v1 OPENAI_API_KEY=... PRIME_AGENT_MODEL=<vendor/model>
or pass --model and --base-url, or set [model] in $PRIME_AGENT_HOME/config.toml (default ~/.prime-agent).
For a model without tool calling, add: -c model.action_format='"text"'"""


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("task", help="the task; '-' reads it from standard input")
    p.add_argument("--cwd", help="project directory (default: the current directory)")
    p.add_argument("--model", help="model name (PRIME_AGENT_MODEL)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    p.add_argument("--max-turns", type=int, metavar="N", help="model calls allowed in the turn (budget.max_steps)")
    p.add_argument("--session-dir", help="where to keep the session (default: $PRIME_AGENT_HOME/sessions/<id>)")
    p.add_argument("--json", action="store_true", help="print one JSON event per line instead of text")
    p.add_argument("--daemon", action="store_true",
                   help="run in a daemon session, which outlives this command (the daemon starts if needed)")
    p.add_argument("--sandbox", choices=["read-only", "workspace-write", "full-access"],
                   help="how the OS confines the agent's code (sandbox.mode; default workspace-write); "
                        "full-access runs it with your rights")
    p.add_argument("--approval", choices=["on-request", "never"],
                   help="when the agent asks to run a command outside the sandbox (or calls an MCP server under "
                        "policy ask): on-request asks you at the "
                        "terminal (the default when there is one), never refuses (the default without)")
    p.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. -c model.temperature=0.2 (repeatable)")


def main(args: argparse.Namespace) -> int:
    cwd = Path(args.cwd or ".").resolve()
    task = sys.stdin.read() if args.task == "-" else args.task
    try:
        config = _config(args, cwd)
    except ConfigError as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if not config.model.configured:
        print(NO_MODEL, file=sys.stderr)
        return EXIT_CONFIG
    if not cwd.is_dir():
        print(f"prime-agent: --cwd {cwd} is not a directory", file=sys.stderr)
        return EXIT_CONFIG
    show = print_json if args.json else Printer().show
    if args.daemon:
        if args.session_dir or any(not o.startswith("budget.") for o in args.config):
            print("prime-agent: with --daemon, the daemon keeps the session and reads config.toml itself; "
                  "only --model, --base-url, --max-turns and -c budget.* pass through", file=sys.stderr)
            return EXIT_CONFIG
        from daemon.client import DaemonError

        try:
            return asyncio.run(run_via_daemon(config, cwd, task, show, print_answer=not args.json))
        except DaemonError as e:
            print(f"prime-agent: {e.message}", file=sys.stderr)
            return EXIT_CONFIG if e.status in (400, 409, 422) else 1
    session_dir = Path(args.session_dir) if args.session_dir else None
    return asyncio.run(_run(config, cwd, task, session_dir, show, print_answer=not args.json))


def _config(args: argparse.Namespace, cwd: Path) -> Config:
    overrides: dict = {}
    for text in args.config:
        merge(overrides, parse_override(text))
    flags = {"name": args.model, "base_url": args.base_url}
    for key, value in flags.items():
        if value:
            overrides.setdefault("model", {})[key] = value
    if args.max_turns is not None:
        overrides.setdefault("budget", {})["max_steps"] = args.max_turns
    if args.sandbox:
        overrides.setdefault("sandbox", {})["mode"] = args.sandbox
    if args.approval or not sys.stdin.isatty():  # without a terminal, nobody to ask
        overrides.setdefault("sandbox", {})["approval"] = args.approval or "never"
    return load_config(cwd, overrides)


async def run_via_daemon(config: Config, cwd: Path, task: str, show, print_answer: bool) -> int:
    """`prime-agent run --daemon`: the same run, in a daemon session that outlives this process."""
    from daemon.client import connect

    async with await connect() as client:
        s = await client.create_session(cwd, model=config.model.name, base_url=config.model.base_url,
                                        budget=config.budget.model_dump(), sandbox=config.sandbox.mode)
        accepted = await client.send(s.id, task)
        code = await follow(client, s.id, accepted.turn_id, None, show, print_answer)
        print(f"[session {s.id} stays in the daemon: prime-agent send {s.id} \"...\" | attach {s.id}]",
              file=sys.stderr)
        return code


async def ask_at_terminal(req: Request) -> Decision:
    """Ask the person at the terminal: may the agent run its command outside the sandbox, or call
    the MCP tool (a server under policy `ask`)?"""
    what = ("run this outside the sandbox, with your rights" if req.kind == "command"
            else "call this tool of an MCP server")

    def ask() -> Decision:
        with open("/dev/tty", "r+") as tty:
            tty.write(f"\nThe agent asks to {what}:\n  {req.summary}\n"
                      + (f"  because: {req.reason}\n" if req.reason else "")
                      + f"Go ahead? [y] once, [a] always for `{req.prefix}` in this session, [N] no: ")
            tty.flush()
            answer = tty.readline().strip().lower()
        return {"y": "approve", "yes": "approve", "a": "always", "always": "always"}.get(answer, "deny")

    try:
        return await asyncio.to_thread(ask)
    except OSError:  # no terminal after all
        return "deny"


async def _run(config: Config, cwd: Path, task: str, session_dir: Path | None, show, print_answer: bool) -> int:
    from agent.model import OpenAIModel
    from agent.session import Session

    model = OpenAIModel(config.model)
    session = Session(config, model, cwd=cwd, session_dir=session_dir, on_event=show)
    session.approvals.ask = ask_at_terminal
    if config.refine.gate_taskset:  # evals (and what it imports) only when a gate is asked for
        from evals.gate import session_gate

        session.use_gate(session_gate(session))
    loop = asyncio.get_running_loop()
    on_ctrl_c(session.interrupt, "stop at once", running=lambda: session.turn is not None)
    try:
        # The kernel boots in its own process while this one imports the model client.
        await asyncio.gather(session.start(), asyncio.to_thread(model.prepare))
        result = await session.prompt(task)
    except asyncio.CancelledError:
        print("prime-agent: stopped", file=sys.stderr)
        return EXIT_CODES["interrupted"]
    finally:
        # Keep Ctrl-C handled while the kernel shuts down; a third press changes nothing now.
        loop.remove_signal_handler(signal.SIGINT)
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        await session.close()
        await model.close()
        loop.remove_signal_handler(signal.SIGINT)
    code = report(result.outcome, result.answer, result.error, print_answer)
    print(f"[session {session.id}: {session.dir}; spent {session.usage.describe()}]", file=sys.stderr)
    return code
