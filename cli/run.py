"""`prime-agent run TASK`: one headless session; prints the final answer.

Exit codes: 0 completed, 2 bad configuration or usage, 3 model error, 4 budget exhausted,
5 model timed out, 130 interrupted. With `--until CMD` (a goal: turns go on until CMD exits 0):
0 achieved, 4 the goal's budget exhausted, 3 error, 130 stopped. Ctrl-C interrupts the running cell (the kernel keeps its
state) and ends the turn; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from agent.approvals import Decision, NoTerminal, Request
from agent.config import Config, ConfigError, load_config
from agent.config_models import ModelConfig
from agent.notebook import Notebook, NotebookError, read_notebook
from cli import invocation
from cli.overrides import add_set, read_overrides
from cli.follow import EXIT_CODES, PrintAnswer, follow, on_ctrl_c, report, say
from cli.show import Printer, print_json
from daemon.meta import title_of

EXIT_CONFIG = 2
PERMISSION_MODES = {"default": None, "acceptEdits": "workspace-write", "plan": None, "bypassPermissions": "full-access"}
"""`--permission-mode` (Claude Code's names) -> the sandbox mode it sets (None: the configuration's)."""

NO_MODEL = """\
prime-agent: no model configured.
Point it at any OpenAI-compatible server:
  OpenAI      export OPENAI_API_KEY=sk-... PRIME_AGENT_MODEL=gpt-4.1
  vLLM        export OPENAI_BASE_URL=http://localhost:8000/v1 PRIME_AGENT_MODEL=<served model name>
  Ollama      export OPENAI_BASE_URL=http://localhost:11434/v1 PRIME_AGENT_MODEL=qwen2.5-coder
  llama.cpp   export OPENAI_BASE_URL=http://localhost:8080/v1 PRIME_AGENT_MODEL=local
  OpenRouter  export OPENAI_BASE_URL=https://openrouter.ai/api/v1 OPENAI_API_KEY=... PRIME_AGENT_MODEL=<vendor/model>
or pass --model and --base-url, or set [model] in $PRIME_AGENT_HOME/config.toml (default ~/.prime-agent).
No model at hand? Pull a small one and serve it offline (docs/models.md):
  prime-agent models pull smollm2-135m-instruct
  prime-agent rl serve --model smollm2-135m-instruct --port 8000 &
  export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 PRIME_AGENT_MODEL=smollm2-135m-instruct
For a model without tool calling, add: --set model.action_format=text"""


def no_model(model: ModelConfig) -> str:
    """NO_MODEL, its first line saying what of the model's settings is missing."""
    if model.name and not model.base_url:
        missing = (f"the model {model.name!r} has no server to go to: no endpoint (--base-url, OPENAI_BASE_URL) "
                   "and no API key for OpenAI's own API (OPENAI_API_KEY)")
    elif model.base_url and not model.name:
        missing = f"a server ({model.base_url}) but no model name to ask it for (--model, PRIME_AGENT_MODEL)"
    else:
        return NO_MODEL
    return NO_MODEL.replace("no model configured.", f"no model configured: {missing}.", 1)


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("task", nargs="?", help="the task; '-' reads it from standard input")
    p.add_argument("--cwd", help="project directory (default: the current directory)")
    p.add_argument("--notebook", metavar="FILE.ipynb",
                   help="run this notebook's code cells in the session's kernel first, each approved as the agent's "
                        "cells are: their state is the agent's starting point (a failing cell stops the run)")
    p.add_argument("--model", help="model name (PRIME_AGENT_MODEL)")
    p.add_argument("--base-url", help="the model API's endpoint (OPENAI_BASE_URL; model.provider says which API)")
    p.add_argument("--max-turns", type=int, metavar="N", help="model calls allowed in the turn (budget.max_steps)")
    p.add_argument("--session-dir", help="where to keep the session (default: $PRIME_AGENT_HOME/sessions/<id>)")
    p.add_argument("--json", action="store_true", help="print one JSON event per line instead of text")
    p.add_argument("--output-format", choices=["text", "json", "stream-json"], default="text",
                   help="Claude Code's headless formats: json, the turn's result object; stream-json, its messages "
                        "one a line (see docs/interop.md)")
    p.add_argument("--input-format", choices=["text", "stream-json"], default="text",
                   help="stream-json: prompts from stdin, one user message a line, each a turn of the session")
    p.add_argument("--daemon", action="store_true",
                   help="run in a daemon session (the daemon starts if needed); the session is closed when the "
                        "turn ends, unless --keep")
    p.add_argument("--keep", action="store_true",
                   help="with --daemon: keep the session open in the daemon after the turn (to `send` it more)")
    p.add_argument("--sandbox", choices=["read-only", "workspace-write", "full-access"],
                   help="how the OS confines the agent's code (sandbox.mode; default workspace-write); "
                        "full-access runs it with your rights")
    p.add_argument("--permission-mode", choices=list(PERMISSION_MODES), default="default",
                   help="Claude Code's modes on this sandbox: default, the configuration's (workspace-write unless "
                        "it says otherwise); acceptEdits, workspace-write: the agent's code writes the workspace "
                        "unasked and asks before anything beyond it; bypassPermissions, full-access; plan: "
                        "the workspace stays read-only while the agent investigates and proposes a plan, which is "
                        "printed (exit 0); with --approve-plan it is approved and carried out in the same session "
                        "(sandbox.plan). See docs/hooks.md#plan-mode-and-permission-modes")
    p.add_argument("--approve-plan", action="store_true", help="with --permission-mode plan: approve the plan and go on")
    p.add_argument("--approval", choices=["on-request", "never"],
                   help="when the agent asks to run a command with more room than its sandbox (or calls an MCP "
                        "server under policy ask): on-request asks you at the terminal (the default when there is "
                        "one), never refuses (the default without)")
    goal = p.add_argument_group("goals", "keep going until a check passes (continuation turns carry its output)")
    goal.add_argument("--until", metavar="CMD",
                      help="a shell command run in the workspace after each turn; the goal is achieved when it exits 0")
    goal.add_argument("--autonomous", action="store_true",
                      help="a goal without a check: continue until the model calls final(), within the budget")
    goal.add_argument("--max-continuations", type=int, metavar="N", help="continuation turns allowed (default 10)")
    goal.add_argument("--max-seconds", type=float, metavar="S", help="wall-clock seconds for the whole goal")
    goal.add_argument("--max-tokens", type=int, metavar="T", help="tokens for the whole goal")
    goal.add_argument("--check-timeout", type=float, metavar="S", help="seconds the check may run (default 300)")
    add_set(p, deprecated_c=True)


def main(args: argparse.Namespace) -> int:
    cwd = Path(args.cwd or ".").resolve()
    problem = stream_json_usage(args)
    if problem:
        print(f"prime-agent: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    task = sys.stdin.read() if args.task == "-" else args.task or ""
    try:
        goal = goal_spec(args, task)
    except ValueError as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config, overrides = _config(args, cwd)
        notebook = read_notebook(Path(args.notebook), args.notebook) if args.notebook else None
    except (ConfigError, NotebookError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if not config.model.configured:
        print(no_model(config.model), file=sys.stderr)
        return EXIT_CONFIG
    if not cwd.is_dir():
        print(f"prime-agent: --cwd {cwd} is not a directory", file=sys.stderr)
        return EXIT_CONFIG
    printer = Printer()
    show = print_json if args.json else printer.show
    if args.output_format != "text":
        from cli.stream_json import StreamJson

        show = StreamJson(config.model.name or "", config.sandbox.mode, config.sandbox.plan,
                          only_result=args.output_format == "json").show
    quiet = args.json or args.output_format != "text"
    print_answer: PrintAnswer = (lambda answer: False) if quiet else printer.unseen
    if args.daemon:
        if args.session_dir or any(not o.startswith("budget.") for o in [*args.deprecated, *args.overrides]):
            print("prime-agent: with --daemon, the daemon keeps the session and reads config.toml itself; "
                  "only --model, --base-url, --max-turns and --set budget.* pass through", file=sys.stderr)
            return EXIT_CONFIG
        from daemon.client import DaemonError

        try:
            return asyncio.run(run_via_daemon(config, cwd, task, show, print_answer=print_answer, goal=goal,
                                              keep=args.keep, notebook=notebook))
        except DaemonError as e:
            print(f"prime-agent: {e.message}", file=sys.stderr)
            return EXIT_CONFIG if e.status in (400, 409, 422) else 1
    session_dir = Path(args.session_dir) if args.session_dir else None
    if args.input_format == "stream-json":
        from cli.stream_json import stdin_prompts

        task = stdin_prompts()
    ask = ask_at_terminal if args.approval or sys.stdin.isatty() else None  # without a terminal, nobody to ask
    return asyncio.run(_run(config, cwd, task, session_dir, show, print_answer=print_answer, goal=goal,
                            approve_plan=args.approve_plan, overrides=overrides, ask=ask, notebook=notebook))


def stream_json_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with the combination of task, --json, the stream-json flags and plan mode, if anything."""
    streamed = args.input_format == "stream-json"
    if (args.task is None) != streamed:
        return "give a task, or --input-format stream-json (prompts on standard input), not both"
    if args.json and args.output_format != "text":
        return "--json (our events) and --output-format (Claude Code's messages) exclude each other"
    if args.sandbox and (sets := PERMISSION_MODES[args.permission_mode]):
        return f"--permission-mode {args.permission_mode} sets the sandbox ({sets}): give it or --sandbox, not both"
    if args.approve_plan and (args.permission_mode != "plan" or args.daemon):
        return "--approve-plan goes with --permission-mode plan, in this process (not with --daemon)"
    if args.keep and not args.daemon:
        return "--keep goes with --daemon (a session of this process is closed when it ends, and stays listed)"
    if streamed and (args.daemon or args.until is not None or args.autonomous):
        return "--input-format stream-json runs its turns in this process, one a prompt: not with --daemon or a goal"
    return None


GOAL_EXIT_CODES = {"achieved": 0, "error": 3, "exhausted": 4, "stopped": 130}


async def follow_goal(client, session_id: str, show, print_answer: PrintAnswer) -> int:
    """Show a daemon session's events until its goal finishes; its exit code."""
    from agent.events import GoalFinished, TurnFinished

    answer = None
    async for event in client.events(session_id, 0):
        show(event)
        if isinstance(event, TurnFinished):
            answer = event.answer
        elif isinstance(event, GoalFinished):
            if event.state == "achieved" and answer and print_answer(answer):
                say(answer)
            elif event.state != "achieved":
                print(f"prime-agent: goal {event.state}: {event.reason}", file=sys.stderr)
            return GOAL_EXIT_CODES[event.state]
    return EXIT_CODES["interrupted"]


def goal_spec(args: argparse.Namespace, task: str):
    """The goal the flags ask for, or None for a plain one-turn run (ValueError for flags that clash)."""
    from pydantic import ValidationError

    from agent.goals import GoalBudget, GoalSpec

    limits = {"max_continuations": args.max_continuations, "max_seconds": args.max_seconds,
              "max_tokens": args.max_tokens}
    if args.until is None and not args.autonomous:
        if any(v is not None for v in limits.values()) or args.check_timeout is not None:
            raise ValueError("--max-continuations, --max-seconds, --max-tokens and --check-timeout bound a goal: "
                             "add --until CMD or --autonomous")
        return None
    if args.until is not None and args.autonomous:
        raise ValueError("--until and --autonomous exclude each other (autonomous mode is a goal without a check)")
    try:
        budget = GoalBudget(**{k: v for k, v in limits.items() if v is not None})
        extra = {"check_timeout": args.check_timeout} if args.check_timeout is not None else {}
        return GoalSpec(text=task, check=args.until, budget=budget, **extra)
    except ValidationError as e:
        raise ValueError("; ".join(f"--{'-'.join(str(p) for p in err['loc'])}: {err['msg']}".replace("_", "-")
                                   for err in e.errors())) from None


def _config(args: argparse.Namespace, cwd: Path) -> tuple[Config, dict]:
    """The run's config, and the overrides (flags and --set) it was loaded with."""
    overrides = read_overrides(args, "run")
    flags = {"name": args.model, "base_url": args.base_url}
    for key, value in flags.items():
        if value:
            overrides.setdefault("model", {})[key] = value
    if args.max_turns is not None:
        overrides.setdefault("budget", {})["max_steps"] = args.max_turns
    if mode := args.sandbox or PERMISSION_MODES[args.permission_mode]:
        overrides.setdefault("sandbox", {})["mode"] = mode
    if args.permission_mode == "plan":
        overrides.setdefault("sandbox", {})["plan"] = True
    if args.approval:  # without it or a terminal, nobody is asked: `_run` is given no way to ask
        overrides.setdefault("sandbox", {})["approval"] = args.approval
    return load_config(cwd, overrides), overrides


async def run_via_daemon(config: Config, cwd: Path, task: str, show, print_answer: PrintAnswer,
                         goal=None, keep: bool = False, notebook: Notebook | None = None) -> int:
    """`prime-agent run --daemon`: the same run, in a daemon session (`notebook`'s cells its first
    turn). The session is closed when its turn (or goal) ends, unless `keep`; one this command
    detached from goes on in the daemon."""
    from daemon.client import DaemonError, connect
    from daemon.schemas import ModelKey

    async with await connect(key=ModelKey.of(config.model)) as client:  # the daemon may have no key, or another
        s = await client.create_session(cwd, model=config.model.name, base_url=config.model.base_url,
                                        title=title_of(goal.text if goal is not None else task),
                                        budget=config.budget.model_dump(), sandbox=config.sandbox.mode,
                                        config={"sandbox": {"plan": True}} if config.sandbox.plan else None)
        code = 0
        if notebook is not None:  # its cells first: the task does not start from a notebook that failed
            accepted = await client.send(s.id, notebook.prompt(), notebook=notebook)
            code = await follow(client, s.id, accepted.turn_id, None, show, lambda answer: False)
        if code == 0 and goal is not None:
            await client.start_goal(s.id, goal.text, check=goal.check, check_timeout=goal.check_timeout,
                                    budget=goal.budget.model_dump(exclude_none=True))
            code = await follow_goal(client, s.id, show, print_answer)
        elif code == 0:
            accepted = await client.send(s.id, task)
            code = await follow(client, s.id, accepted.turn_id, None, show, print_answer)
        if not keep:
            try:
                await client.close_session(s.id, if_idle=True)
                print(f"[session {s.id} closed; {invocation()} send {s.id} \"...\" opens it again]", file=sys.stderr)
                return code
            except DaemonError as e:
                if e.status != 409:  # busy: detached from a turn that goes on
                    raise
        print(f"[session {s.id} stays in the daemon: {invocation()} send {s.id} \"...\" | attach {s.id} | "
              f"sessions close {s.id}]", file=sys.stderr)
        return code


async def ask_at_terminal(req: Request) -> Decision:
    """Ask the person at the terminal: may the agent run its command (in a sandbox of its own, with
    the workspace writable), or call the MCP tool (a server under policy `ask`)? What the request
    holds is shown as it is (agent/approvals.py wrote its control characters as escapes). A terminal
    that cannot be opened or read is said on stderr and raised as NoTerminal: denied, and recorded as
    no person's decision."""
    what = "run this command" if req.kind == "command" else "call this tool of an MCP server"
    always = f"[a] always for `{req.prefix}` in this session, " if req.prefix else ""
    full = "[f] once with your full environment (secrets too), " if req.kind == "command" else ""
    question = (f"\nThe agent asks to {what}:\n  {req.summary}\n"
                + (f"  because: {req.reason}\n" if req.reason else "")
                + (f"  it runs {req.runs_in}\n" if req.runs_in else "")
                + "".join(f"  WARNING: {note}\n" for note in req.notes)
                + f"Go ahead? [y] once, {always}{full}[N] no: ")

    def ask() -> str:
        # Unbuffered bytes: a text-mode "r+" on a terminal is not seekable, which Python refuses.
        with open("/dev/tty", "rb+", buffering=0) as tty:
            tty.write(question.encode())
            return tty.readline().decode(errors="replace").strip().lower()

    try:
        answer = await asyncio.to_thread(ask)
    except OSError as e:
        why = f"the terminal could not be used to ask ({e.strerror or e})"
        print(f"prime-agent: the agent asked to {what} ({req.summary}), but {why}: denied, and no person "
              "decided; run it at a terminal, or in the daemon (--daemon) to decide in the app", file=sys.stderr)
        raise NoTerminal(why) from None
    req.full_env = bool(full) and answer == "f"
    answers: dict[str, Decision] = {"y": "approve", "yes": "approve", "f": "approve"}
    if always:
        answers.update(a="always", always="always")
    return answers.get(answer, "deny")


async def _run(config: Config, cwd: Path, task: str | AsyncIterator[str], session_dir: Path | None, show,
               print_answer: PrintAnswer, goal=None, approve_plan: bool = False, overrides: dict | None = None,
               ask=ask_at_terminal, notebook: Notebook | None = None) -> int:
    """One session: the task (or each prompt of a stream, a turn each), or a goal. In plan mode the
    plan is the answer; `approve_plan` approves it and carries it out in the same session. The session
    is in the registry as the daemon's are (daemon/registry.py): listed while it runs, closed after."""
    from agent.providers import open_model
    from agent.session import Session
    from daemon.registry import Hosted, InUse

    model = open_model(config.model)
    gate = None
    if config.refine.gate_taskset:  # evals (and what it imports) only when a gate is asked for
        from evals.gate import gate_for as gate
    session = Session(config, model, cwd=cwd, session_dir=session_dir, on_event=show, ask=ask, gate=gate)
    title = title_of(goal.text if goal is not None else task) if isinstance(task, str) else None
    try:
        hosted = Hosted.register(session.id, session.layout, cwd, config, overrides or {}, title)
    except (InUse, FileExistsError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    session.listeners.insert(0, hosted.on_event)  # journaled before it is shown
    loop = asyncio.get_running_loop()
    on_ctrl_c(session.interrupt, "stop at once", running=lambda: session.turn is not None)
    try:
        # The kernel boots in its own process while this one imports the model client.
        await asyncio.gather(session.start(), asyncio.to_thread(model.prepare))
        loaded = await session.prompt(notebook.prompt(), notebook=notebook) if notebook is not None else None
        if loaded is not None and loaded.outcome != "completed":
            goal, result = None, loaded  # the task does not start from a notebook that failed
        elif goal is not None:
            from agent.goals import GoalState

            state = await session.pursue(GoalState.new(goal))
        elif isinstance(task, str):
            result = await session.prompt(task)
            if approve_plan and session.plan is not None:
                print(f"[plan approved (--approve-plan):]\n{session.plan}", file=sys.stderr)
                result = await session.prompt(await session.decide_plan(True) or "")
        else:
            result = None
            async for prompt in task:
                result = await session.prompt(prompt)
        await session.checkpoints.settle()  # the last turn's end checkpoint: `rewind` can come back to it
    except asyncio.CancelledError:
        print("prime-agent: stopped", file=sys.stderr)
        return EXIT_CODES["interrupted"]
    finally:
        # Keep Ctrl-C handled while the kernel shuts down; a third press changes nothing now.
        loop.remove_signal_handler(signal.SIGINT)
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        try:
            await session.close()
            await model.close()
        finally:
            hosted.close()
        loop.remove_signal_handler(signal.SIGINT)
    if goal is not None:
        answer = session.last_result.answer if session.last_result else None
        if state.state == "achieved" and answer and print_answer(answer):
            say(answer)
        elif state.state != "achieved":
            print(f"prime-agent: goal {state.state}: {state.reason}", file=sys.stderr)
        print(f"[goal {state.summary()}]", file=sys.stderr)
        code = GOAL_EXIT_CODES[state.state]
    elif result is None:
        print("prime-agent: no prompt came on standard input", file=sys.stderr)
        code = EXIT_CONFIG
    else:
        code = report(result.outcome, result.answer, result.error, print_answer(result.answer))
    print(f"[session {session.id}: {session.dir}; spent {session.usage.describe()}]", file=sys.stderr)
    return code
