"""How the host runs a command for something a person trusted (an MCP server, a hook): nothing of it
is resolved from the workspace, which a cell may have written, unless a person trusted those bytes.

- It starts in a neutral folder (`Host.cwd`): empty, read-only, outside the project and hidden from
  every kernel, so `python3 -m pkg`, `npx tool`, `uv run` and a relative path find nothing a cell wrote.
- Its search paths leave the project out (`Host.env`): PATH, PYTHONPATH and NODE_PATH lose their
  relative entries and those inside the project (a `.venv/bin` there), and PYTHONSAFEPATH=1 keeps
  Python from putting the script's folder or the working directory first on its path.
- The project files its command line names are pinned (`Host.pinned`): a person trusts their content
  with the configuration that names them (`prime-agent trust`, agent/trust.py), a file changed since
  holds the command back, and the command runs a copy of what was checked
  (`$PRIME_AGENT_HOME/pinned/<sha256>/<name>`, out of every kernel's reach), never the file in the
  workspace, which a cell could rewrite between the check and the start.

A word of a command line names the project when, resolved against the project's folder (the
session's: what `$CLAUDE_PROJECT_DIR` names), it lies inside the project root. What is pinned is
what the command runs: the command itself (`./tools/server`), and after an interpreter or launcher
(INTERPRETERS: `python3`, `node`, `bash`, `uv`, `npx`, `env`...) every file of the project it names
with a code suffix (CODE_SUFFIXES: its script, a `--require ./preload.js`) and the first without one
(a script named `serve`); never a file whose suffix says it is data (DATA_SUFFIXES: a database).
Other files and folders are passed as absolute paths to an MCP server (it starts elsewhere) and left
as written in a hook. Code that is absent (the command, a CODE_SUFFIXES name after an interpreter) is refused,
so that a cell cannot create it after the check. Options (`-x`, `--flag`), URLs and a command
without a `/` (found on the filtered PATH) name nothing. What a program finds by itself (a module it
imports, a script without a suffix absent at the check, a `cwd` you set inside the project) is not
pinned: that is the neutral folder's and the search paths' work, or yours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shlex
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.trust import ProjectFile, TrustStore

PIN_MAX_BYTES = 32 << 20
"""The largest file a command may name in the project (a bundled script, a compiled server)."""
DATA_SUFFIXES = frozenset(".db .sqlite .sqlite3 .duckdb .json .jsonl .csv .tsv .txt .md .log .yaml .yml .toml "
                          ".ini .cfg .conf .xml .html .pdf .png .jpg .jpeg .gif .parquet".split())
"""What a program reads or writes as data: named, never pinned (a database changes with every call)."""
CODE_SUFFIXES = frozenset(".py .pyw .pyz .js .mjs .cjs .ts .mts .cts .jsx .tsx .sh .bash .zsh .fish .rb .pl "
                          ".pm .php .lua .r .jl .jar .wasm".split())
"""An absent file with one of these names is code the command would run: refused, never left to appear."""
INTERPRETERS = re.compile(r"(python|pypy)[0-9.]*|node(js)?|deno|bun|tsx|ts-node|(ba|da|z|k)?sh|fish|ruby|perl|php|lua"
                          r"|Rscript|julia|java|uv|npx|env")
"""Commands that run a file their arguments name (their script, and any with a CODE_SUFFIXES name)."""
SEARCH_PATHS = ("PATH", "PYTHONPATH", "NODE_PATH")
PROJECT_VARS = re.compile(r"\$(?:\{(?:CLAUDE|PRIME_AGENT)_PROJECT_DIR\}|(?:CLAUDE|PRIME_AGENT)_PROJECT_DIR(?![A-Za-z0-9_]))")
"""`$CLAUDE_PROJECT_DIR` and `$PRIME_AGENT_PROJECT_DIR` in a hook's command line: the host knows them."""

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
"""`${VAR}` and `${VAR:-default}` in an MCP server's settings."""

Command = Sequence[str | None]
"""One simple command's words, the command first; None for a word the host does not evaluate (an
expansion other than the project's folder, a command substitution, a glob)."""


class Untrusted(Exception):
    """A command names a project file nobody trusted as it is (or one that is absent): not run."""


def expand(text: str, environ: Mapping[str, str]) -> str:
    """`${VAR}` and `${VAR:-default}` from `environ`; KeyError (the name) for one unset without a default."""
    def one(m: re.Match) -> str:
        value = environ.get(m[1])
        if value is None or (value == "" and m[2] is not None):
            if m[2] is None:
                raise KeyError(m[1])
            return m[2]
        return value
    return VAR.sub(one, text)


def server_words(command: str, args: Sequence[str], environ: Mapping[str, str]) -> list[str | None]:
    """An MCP server's command line as it will run, for `Host.pinned` (None: a word with a variable unset)."""
    out: list[str | None] = []
    for word in (command, *args):
        try:
            out.append(expand(word, environ))
        except KeyError:
            out.append(None)
    return out


@dataclass(frozen=True)
class Target:
    """A word of a command that names the project."""

    index: int
    kind: Literal["pin", "path", "absent"]
    """pin: a file to run as trusted; path: a folder or data, passed as `path`; absent: refused."""
    path: Path
    """Relative to the project root (pin, absent), or absolute (path)."""


@dataclass(frozen=True)
class Host:
    """Where and how the host runs commands for one project: `home` is $PRIME_AGENT_HOME (the trust
    store, the copies, a neutral folder), `root` the project's root (agent.config.project_root of
    `base`), `base` the folder relative paths are read against (the session's, `$CLAUDE_PROJECT_DIR`)."""

    home: Path
    root: Path
    base: Path

    def within(self, cwd: str | None) -> Host:
        """This host with relative paths read in `cwd` (an MCP server's own setting, relative to `base`)."""
        return self if not cwd else dataclasses.replace(self, base=Path(os.path.normpath(self.base / cwd)))

    @property
    def store(self) -> TrustStore:
        return TrustStore(self.home)

    @property
    def cwd(self) -> Path:
        """An empty read-only folder outside the project, hidden from every kernel: in the home (which
        every sandbox covers), else, when the home lies in the project (a workspace holding it), in
        the temporary folder (read-only in every sandbox), so that nothing a walk up from it finds
        (a `node_modules`, a `pyproject.toml`) is the workspace's."""
        for folder in (self.home.resolve() / "empty",
                       Path(tempfile.gettempdir()).resolve() / f"prime-agent-{os.getuid()}-empty"):
            with contextlib.suppress(OSError):
                if not _within(folder, self.root) and _empty_folder(folder):
                    return folder
        return Path("/")

    def env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`environ` with the project out of its search paths, and PYTHONSAFEPATH=1."""
        out = dict(environ)
        for name in SEARCH_PATHS:
            if name in out:
                out[name] = os.pathsep.join(p for p in out[name].split(os.pathsep)
                                            if os.path.isabs(p) and not _within(Path(os.path.normpath(p)), self.root))
        return {**out, "PYTHONSAFEPATH": "1"}

    def targets(self, words: Command) -> Iterator[Target]:
        """The words of one command that name the project (see the module's docstring)."""
        runs = bool(words) and words[0] is not None and INTERPRETERS.fullmatch(Path(words[0]).name) is not None
        script = False  # an interpreter's script without a code suffix found
        for i, word in enumerate(words):
            if not word or word.startswith("-") or "://" in word or (i == 0 and "/" not in word):
                continue
            path = Path(os.path.normpath(self.base / word))
            if not _within(path, self.root):
                try:
                    path = path.resolve()  # a link from outside into the project
                except (OSError, RuntimeError, ValueError):
                    continue
                if not _within(path, self.root):
                    continue
            code = i == 0 or (runs and path.suffix.lower() in CODE_SUFFIXES)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                if code:
                    yield Target(i, "absent", path.relative_to(self.root))
                continue
            except (OSError, ValueError):  # a name the file system refuses: nothing a program finds either
                continue
            if stat.S_ISDIR(st.st_mode) or (i > 0 and path.suffix.lower() in DATA_SUFFIXES):
                yield Target(i, "path", path)
            elif code or (runs and not script):
                script |= not code  # the first file without a code suffix: its script, arguments after it
                yield Target(i, "pin", path.relative_to(self.root))
            else:
                yield Target(i, "path", path)

    def pinned(self, commands: Sequence[Command]) -> list[str]:
        """The project files (relative to its root) the commands run: trusted with their config."""
        return list(dict.fromkeys(str(t.path) for words in commands for t in self.targets(words) if t.kind == "pin"))

    def untrusted(self, paths: Sequence[str], what: str) -> list[ProjectFile]:
        """Each of `paths` (from `pinned`) not trusted as it is now."""
        files = (self.store.check(self.root, p, what, PIN_MAX_BYTES) for p in paths)
        return [f for f in files if f is not None and f.status != "trusted"]

    def prepare(self, commands: Sequence[Command], what: str) -> dict[tuple[int, int], Target]:
        """What runs in place of each word (command, word) that names the project, as the commands
        start: a pinned file's copy of the content checked (absolute, kind `pin`), or a folder's or
        data file's absolute path. Raises Untrusted for a file not trusted as it is now, or absent."""
        out: dict[tuple[int, int], Target] = {}
        for c, words in enumerate(commands):
            for t in self.targets(words):
                f = self.store.check(self.root, str(t.path), what, PIN_MAX_BYTES) if t.kind == "pin" else None
                if t.kind == "absent" or (t.kind == "pin" and f is None):
                    raise Untrusted(f"{t.path} ({what}) is absent, so it does not run")
                if f is not None and f.status != "trusted":
                    raise Untrusted(f.line("it does not run"))
                out[c, t.index] = t if f is None else Target(t.index, "pin", self._copy(f.content or b"", t.path.name))
        return out

    def _copy(self, content: bytes, name: str) -> Path:
        """The content checked, as a file of its own out of every kernel's reach (executable, read-only)."""
        path = self.home / "pinned" / hashlib.sha256(content).hexdigest() / name
        if not path.is_file():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, part = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.")  # hooks may start at once
            with open(fd, "wb") as f:
                f.write(content)
                os.fchmod(fd, 0o500)
            os.replace(part, path)
        return path

    def argv(self, words: Sequence[str], what: str) -> list[str]:
        """An MCP server's command and arguments as they run: pinned files as their checked copies,
        the project's folders and data files as absolute paths (the server starts elsewhere)."""
        done = self.prepare([words], what)
        return [str(done[0, i].path) if (0, i) in done else w for i, w in enumerate(words)]

    def shell(self, line: str, what: str) -> str:
        """A hook's command line as it runs: each pinned file it names replaced by its checked copy
        (the rest as written: after a `cd "$CLAUDE_PROJECT_DIR"` its relative paths name the project)."""
        commands = shell_commands(line, str(self.base))
        done = self.prepare([[w.value for w in words] for words in commands], what)
        for word, t in sorted(((commands[c][i], t) for (c, i), t in done.items() if t.kind == "pin"),
                              key=lambda item: -item[0].start):
            line = line[:word.start] + shlex.quote(str(t.path)) + line[word.end:]
        return line

    def shell_words(self, line: str) -> list[list[str | None]]:
        """A hook's command line as commands of words, for `pinned`."""
        return [[w.value for w in words] for words in shell_commands(line, str(self.base))]


def _empty_folder(folder: Path) -> bool:
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o500)
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


# --- a hook's shell command line ------------------------------------------------------------------

SEPARATORS = " \t\n;&|()<>`"
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Word:
    start: int
    end: int
    value: str | None
    """The word as the shell would pass it, None when it holds an expansion the host does not
    evaluate (any variable but the project's, a command substitution, a glob, `~`)."""


def shell_commands(line: str, project: str, i: int = 0, n: int | None = None) -> list[list[Word]]:
    """The simple commands of a shell command line (of `line[i:n]`), each its words with where they
    are in `line` (the targets of redirections and leading assignments left out), those of command
    substitutions included: enough of sh's grammar to find the words that name files, never to run
    anything."""
    commands: list[list[Word]] = []
    words: list[Word] = []
    n, redirect = len(line) if n is None else n, False
    while i < n:
        c = line[i]
        if c in " \t":
            i += 1
        elif c == "#":  # a comment, to the end of its line
            end = line.find("\n", i, n)
            i = n if end < 0 else end
        elif c in "<>":
            while i < n and line[i] in "<>&|":
                i += 1
            redirect = True
        elif c in SEPARATORS:
            if words:
                commands.append(words)
                words = []
            i += 1
        else:
            start = i
            inner: list[tuple[int, int]] = []
            value, i = _word(line, i, n, project, inner)
            if redirect:
                redirect = False
            elif not (not words and ASSIGNMENT.match(line, start)) and not (line[start:i].isdigit() and
                                                                             line[i:i + 1] in ("<", ">")):
                words.append(Word(start, i, value))
            for a, b in inner:  # "$(...)" and "`...`" inside double quotes
                commands += shell_commands(line, project, a, b)
    if words:
        commands.append(words)
    return commands


def _word(line: str, i: int, n: int, project: str, inner: list[tuple[int, int]]) -> tuple[str | None, int]:
    """The word at `i` as sh passes it (None: with an expansion), where it ends, and the command
    substitutions inside its double quotes (added to `inner`)."""
    out: list[str] = []
    dynamic = False
    while i < n and line[i] not in SEPARATORS:
        c = line[i]
        if c == "'":
            end = line.find("'", i + 1, n)
            if end < 0:
                return None, n
            out.append(line[i + 1:end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and line[i] != '"':
                if line[i] == "\\" and line[i + 1:i + 2] in ('$', '`', '"', "\\"):
                    out.append(line[i + 1])
                    i += 2
                elif (m := PROJECT_VARS.match(line, i)) is not None:
                    out.append(project)
                    i = m.end()
                elif line.startswith("$(", i) or line[i] == "`":
                    end = _closing(line, i, n)
                    inner.append((i + (2 if line[i] == "$" else 1), end))
                    dynamic, i = True, end + 1
                else:
                    dynamic |= line[i] == "$"
                    out.append(line[i])
                    i += 1
            if i >= n:
                return None, n
            i += 1
        elif c == "\\":
            out.append(line[i + 1:i + 2])
            i += 2
        elif (m := PROJECT_VARS.match(line, i)) is not None:
            out.append(project)
            i = m.end()
        else:
            dynamic |= c in "$*?[~"
            out.append(c)
            i += 1
    return (None if dynamic else "".join(out)), i


def _closing(line: str, i: int, n: int) -> int:
    """Where the command substitution opening at `i` (`$(` or a backquote) closes (n: nowhere)."""
    if line[i] == "`":
        end = line.find("`", i + 1, n)
        return n if end < 0 else end
    depth, i = 0, i + 1
    while i < n:
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return i
        i += 1
    return n


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
