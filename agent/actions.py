"""The two action formats a model acts in: native tool calling with the one `ipython` tool (its
definition, sent with every request, and its arguments checked), and text mode, where the model
writes ```python fenced cells."""

from __future__ import annotations

import json
import re
from typing import Any

from agent.types import ToolCall

IPYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "ipython",
        "description": (
            "Run Python code in your persistent IPython kernel and see its output. Variables, "
            "imports and the working directory persist across calls. Cell magics such as %%bash work."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code cell to run."},
                "timeout": {"type": "integer", "description": "Seconds before the cell is interrupted (optional)."},
            },
            "required": ["code"],
        },
    },
}
FENCE = re.compile(r"```(?:python|py|ipython)[ \t]*\n(.*?)```", re.DOTALL)


def fenced_cells(text: str) -> list[str]:
    """The ```python cells in a text-mode reply, in order."""
    return [m.group(1) for m in FENCE.finditer(text)]


def parse_tool_arguments(call: ToolCall) -> dict[str, Any]:
    """The `ipython` tool's arguments; raises ValueError with a message for the model."""
    if call.name != "ipython":
        raise ValueError(f"unknown tool {call.name!r}: the only tool is `ipython` with arguments {{code, timeout?}}")
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"the tool call's arguments are not valid JSON ({e}); send {{\"code\": \"...\"}}") from None
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        raise ValueError('the tool call needs a string argument "code", e.g. {"code": "print(1)"}')
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0)):
        raise ValueError('"timeout" must be a positive number of seconds')
    return args
