"""The action formats (agent/actions.py): the `ipython` tool's arguments as a model sends them."""

from __future__ import annotations

import pytest

from agent.actions import parse_tool_arguments
from agent.types import ToolCall


def test_tool_arguments_are_checked_with_messages_for_the_model():
    call = lambda args, name="ipython": ToolCall(id="c", name=name, arguments=args)  # noqa: E731
    assert parse_tool_arguments(call('{"code": "1", "timeout": 5}')) == {"code": "1", "timeout": 5}
    for bad, message in [
        ('{"code": "1"', "not valid JSON"),
        ('{"cmd": "ls"}', 'needs a string argument "code"'),
        ('{"code": "1", "timeout": -1}', "positive number"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_tool_arguments(call(bad))
    with pytest.raises(ValueError, match="unknown tool 'bash'"):
        parse_tool_arguments(call('{"code": "1"}', name="bash"))
