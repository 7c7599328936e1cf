"""The harness in force for this session: entries by kind, with their scope; Enter shows one."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Markdown, Static, Tree
from textual.widgets.tree import TreeNode

from daemon.client import Client, DaemonError

PLURAL = {"prompt": "prompt notes", "memory": "memories", "skill": "skills", "subagent": "subagents"}


class HarnessScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "back")]

    def __init__(self, client: Client, session_id: str):
        super().__init__()
        self.client, self.session_id = client, session_id

    def compose(self) -> ComposeResult:
        yield Static("Harness: what this session's prompt is built from (narrowest scope wins)", classes="title")
        with Horizontal():
            yield Tree("harness", id="entries")
            with VerticalScroll(id="entry"):
                yield Markdown("Choose an entry.")
        yield Footer()

    async def on_mount(self) -> None:
        tree = self.query_one(Tree)
        tree.root.expand()
        try:
            entries = await self.client.harness(session=self.session_id)
        except DaemonError as e:
            self.notify(e.message, severity="error")
            return
        kinds: dict[str, TreeNode] = {}
        for row in sorted(entries, key=lambda r: (r.kind, r.id)):
            node = kinds.get(row.kind) or tree.root.add(PLURAL.get(row.kind, row.kind), expand=True)
            kinds[row.kind] = node
            node.add_leaf(Text.assemble(row.id, "  ", (row.scope, "dim"), "  ", row.title), data=row.id)
        if not entries:
            tree.root.add_leaf("(no entries yet: the refiner and you add them)")
        tree.focus()

    async def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        if event.node.data is None:
            return
        try:
            text = await self.client.harness_entry(event.node.data, session=self.session_id)
        except DaemonError as e:
            text = f"*{e.message}*"
        await self.query_one("#entry Markdown", Markdown).update(f"```markdown\n{text}\n```")
