"""Harness versions: which commit of each scope a reference names, and private copies at those commits.

    commits = resolve_version("project@4d5e6f", stores)       # or "user@1a2b3c project@4d5e6f", or "r-2026..."
    roots = check_out(stores, commits, tmp)                    # sessions run on these; the live scopes stay

A harness version is each scope's commit, written as a session's trajectory records it:
`user@1a2b3c project@4d5e6f`. A reference without `SCOPE@` (a commit, a refinement id, a tag) must be
held by exactly one scope; `HEAD~1`, which every scope with history holds, needs its scope named.
"""

from __future__ import annotations

from pathlib import Path

from harness_store.entries import HarnessError
from harness_store.store import ForeignRepository, HarnessStore, NotFound, Scope

SCOPES = ("user", "project", "session")


def resolve_version(ref: str, stores: dict[Scope, HarnessStore]) -> dict[Scope, str]:
    """The commit of each scope `ref` names (the scopes it does not name are not in the answer)."""
    words = ref.split()
    if not words:
        raise HarnessError("an empty harness version: give a commit, a refinement id, a tag or SCOPE@REV")
    out: dict[Scope, str] = {}
    for word in words:
        scope, at, rev = word.partition("@")
        if at and scope in SCOPES:
            if scope not in stores:
                raise HarnessError(f"{word}: no {scope} scope here; one of {', '.join(stores)}")
            if scope in out:
                raise HarnessError(f"{ref}: the {scope} scope is named twice")
            out[scope] = stores[scope].resolve(rev)  # type: ignore[index]
            continue
        if len(words) > 1:
            raise HarnessError(f"{ref}: name each scope of a version with several parts (SCOPE@REV)")
        found = {}
        for name, store in stores.items():
            try:
                found[name] = store.resolve(word)
            except NotFound:
                pass
        if not found:
            raise NotFound(f"no harness scope holds {word!r} (give a commit, a refinement id, a tag, or SCOPE@REV: "
                           f"`prime-agent harness log --scope SCOPE` lists them)")
        if len(found) > 1:
            raise HarnessError(f"{word!r} names a commit in more than one scope ({', '.join(found)}): "
                               f"say which, e.g. {next(iter(found))}@{word}")
        out.update(found)
    return out


def check_out(stores: dict[Scope, HarnessStore], commits: dict[Scope, str | None], dest: Path) -> dict[Scope, Path]:
    """Private copies of `stores` under `dest`, each at `commits[scope]` (a scope not named: at its HEAD;
    None, or a scope with no history: empty). Nothing uncommitted is copied."""
    roots: dict[Scope, Path] = {}
    for scope, store in stores.items():
        roots[scope] = dest / scope
        if scope not in commits and store.exists() and (why := store.problem()) is not None:
            raise ForeignRepository(why)
        commit = commits[scope] if scope in commits else store.head()
        if commit is None:
            roots[scope].mkdir(parents=True, exist_ok=True)
        else:
            store.checkout(commit, roots[scope])
    return roots
