"""Checkpoints at every turn boundary, and rewinding to any of them.

A checkpoint holds the four things a turn changes:
- the workspace's files: a tree in a shadow git repository under $PRIME_AGENT_HOME/checkpoints,
  whose work tree is the workspace (`WorkspaceStore`). It never touches the user's own repository
  (no commit, branch, stash, ref or index change there), reads the workspace's .gitignore files,
  copies no file over the size caps (and says which it skipped), and sees every change on disk,
  whoever made it: the file helpers, `%%bash`, a subprocess, the person's editor;
- the conversation: the context the trajectory's records up to the checkpoint make;
- the harness: each scope's commit;
- the kernel: a snapshot of the user namespace (agent/kernel/runtime/snapshot.py), taken when a turn ends
  by a forked child of the kernel, off the turn's path.

`start` checkpoints are taken before a turn's prompt joins the context, `end` ones once it ended
(in the background). A rewind is a recorded step that loses nothing: it checkpoints the present
first, restores what was asked for (files, a harness commit that restores the old state, the
context, the namespace), and writes an intent file first and removes it last, so a crash midway
is finished at the next start (`recover`): the old state or the new, never a mix.
"""

from agent.checkpoints.recovery import recover
from agent.checkpoints.rewind import PARTS, Part, Plan, rewound
from agent.checkpoints.session import Checkpoints
from agent.checkpoints.store import WorkspaceStore
from agent.checkpoints.turns import RewindError, TurnRow, turn_list

__all__ = ["PARTS", "Checkpoints", "Part", "Plan", "RewindError", "WorkspaceStore", "recover", "rewound", "TurnRow", "turn_list"]
