"""What a person opens stays where they are reading."""

from __future__ import annotations

from textual.widget import Widget


def hold_view(widget: Widget) -> None:
    """Release the anchor of the view that scrolls `widget` (the conversation follows its end, see
    Conversation): a cell or diff expanded at the bottom grows from where it is, rather than the view
    jumping to the end of what it opened. Sending the next prompt anchors the view again."""
    for ancestor in widget.ancestors:
        if isinstance(ancestor, Widget) and ancestor.is_anchored:
            ancestor.release_anchor()
            return
