"""What an approval's `always` covers: the rule a command yields (`rule_of`), what the request shows of
it (`prefix_of`) and whether it covers a later command (`covers`).

A rule repeats what the person saw and nothing wider. It has one of three shapes, told by its words:
- the same command again, word for word (most programs: `make test`, `cargo build --release`, and
  `rm -rf build`, `curl -o x URL`, `chmod +x run.sh`: a program that deletes, moves or fetches gets
  this shape only, never one that varies its arguments);
- `git add` and `git commit` with the same options (in any order) and any other words: paths, the
  message (`git commit -m …`);
- a program that only reads (`cat`, `ls`, `grep`...), with the same options and paths inside the
  workspace (`cat -n …`: not `cat -n ~/.ssh/id_rsa`).
There is none (`always` is not offered) for a chain, control characters, leading `NAME=value`
(LD_PRELOAD, GIT_SSH_COMMAND), a program named by a path or found in the workspace, a program that
runs what it is given or what it fetches (interpreters, `python3 -m pytest` included: a planted
`pytest.py` is what `-m` imports; launchers; package managers: `pip install` of anything), an option
that makes a program run a command (git's `--upload-pack`, `--receive-pack`, `-x`, `-O`, `--output`;
rsync's `-e`; tar's `--to-command`), the git subcommands that run what its configuration names or
change where it sends things (`config`, `remote`, `submodule`, `bisect`...) and an option before
git's subcommand (`git -c core.fsmonitor=... status`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from pathlib import Path

from agent.types import has_control

CHAINS = set(";&|`$()<>\n\\")
"""Characters with which one command line runs others: such a line is never a rule's."""
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
INTERPRETERS = ("python*", "pypy*", "ipython*", "sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "csh", "tcsh",
                "node", "nodejs", "bun", "deno", "ruby", "irb", "perl", "php", "lua*", "tclsh", "rscript", "osascript",
                "pwsh", "powershell", "awk", "gawk", "mawk", "nawk", "sed", "julia", "java", "groovy", "elixir",
                "vi", "vim", "nvim", "ex", "ed", "emacs*")
"""Programs that run the code they are given (a script, `-m module`, `-c code`, an editor's `-c`)."""
LAUNCHERS = ("env", "xargs", "sudo", "doas", "su", "runuser", "pkexec", "exec", "nohup", "timeout", "nice", "ionice",
             "chrt", "taskset", "stdbuf", "unbuffer", "time", "command", "builtin", "eval", "source", ".", "setsid",
             "setpriv", "flock", "chroot", "unshare", "nsenter", "firejail", "bwrap", "strace", "ltrace", "gdb",
             "valgrind", "perf", "watch", "script", "parallel", "find", "ssh", "busybox", "tmux", "screen",
             "systemd-run", "dbus-run-session", "caffeinate", "xdg-open", "open")
"""Programs that run another command named somewhere in their arguments."""
PACKAGE_MANAGERS = ("pip", "pip3*", "pipx", "uv", "uvx", "poetry", "pdm", "hatch", "rye", "conda", "mamba",
                    "micromamba", "npm", "npx", "pnpm", "pnpx", "yarn", "bunx", "gem", "bundle", "composer",
                    "apt", "apt-get", "dnf", "yum", "brew", "nix", "nix-shell", "snap", "flatpak")
"""Programs that fetch packages and run their install scripts, or the scripts a project's manifest names."""
FETCHES = {"cargo": {"install"}, "go": {"install", "get", "run", "generate"}}
"""Subcommands of build tools that fetch or run what they name."""
READ_ONLY = ("cat", "head", "tail", "wc", "ls", "stat", "grep", "egrep", "fgrep", "diff", "cmp", "du", "nl",
             "md5sum", "sha1sum", "sha256sum", "sha512sum")
"""Programs that only read the paths they are given: their rule covers paths inside the workspace."""
EXEC_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "git": (("--upload-pack", "--receive-pack", "--exec", "--output", "--output-directory", "--open-files-in-pager",
             "--extcmd", "--ext-diff", "--template", "--config", "--tool", "--strategy"), ""),
    "rsync": (("--rsh", "--rsync-path"), "e"),
    "tar": (("--to-command", "--checkpoint-action", "--use-compress-program", "--rsh-command", "--rmt-command",
             "--info-script", "--new-volume-script"), "IF"),
    "scp": ((), "SFo"), "sftp": ((), "SFoD"), "zip": (("--unzip-command",), "T"), "sort": (("--compress-program",), ""),
}
"""Options that make a program run a command: long ones (and their abbreviations, as getopt and git take
them), short ones as letters anywhere in a `-abc` cluster."""
GIT_EXEC_SHORT = {"clone": "uc", "fetch": "u", "ls-remote": "u", "rebase": "x", "grep": "O",
                  "format-patch": "o", "merge": "s", "pull": "s"}
"""git's short options that run a command or write a file by name, per subcommand (`rebase -x`, `grep -O`)."""
GIT_NEVER = {"config", "remote", "submodule", "bisect", "filter-branch", "difftool", "mergetool", "hook", "daemon",
             "instaweb", "web--browse", "send-email", "credential", "credential-cache", "credential-store", "worktree",
             "archive", "help", "shell", "upload-pack", "receive-pack", "upload-archive", "p4", "svn", "cvsimport",
             "cvsserver", "quiltimport", "maintenance", "var"}
"""git subcommands that run what the configuration names, rewrite it, or change where git sends things."""
GIT_ANY_ARGUMENTS = {"add", "commit"}
"""git subcommands whose rule covers any paths and message, with the same options."""


def _is(word: str, names: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(word.lower(), n) for n in names)


def words_of(command: str) -> list[str] | None:
    """One command's words; None for a chain, control characters, or a line shlex cannot split."""
    if CHAINS & set(command) or has_control(command):
        return None
    try:
        return shlex.split(command) or None
    except ValueError:
        return None


def commands_of(line: str) -> list[list[str]] | None:
    """The commands of a line that joins them only with `&&`, `||` or `;` (None: a pipe, a subshell,
    a substitution, a redirection, a backslash or control characters)."""
    if has_control(line) or (CHAINS - set(";&|")) & set(line):
        return None
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, ""  # `a#b`: one word, as sh reads it, never a comment
    out: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in ("&&", "||", ";"):
                out.append([])
            elif set(token) <= set(";&|"):
                return None
            else:
                out[-1].append(token)
    except ValueError:
        return None
    return out if all(out) else None


def resolves_inside(program: str, workspace: Path) -> bool:
    """Whether `program` (a name, run through PATH) is a file in the workspace: one the agent can rewrite."""
    root = os.path.realpath(workspace)
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = Path(workspace, d or ".", program)  # a relative entry is relative to where the command runs
        if path.is_file() and os.access(path, os.X_OK):
            return _within(os.path.realpath(path), root)
    return False


def path_outside(path: str, workspace: Path) -> str:
    """`path` (a PATH) without its entries inside the workspace, relative ones included (they are
    relative to where the command runs): what finds `git` for a line whose repository is writable."""
    root = os.path.realpath(workspace)
    return os.pathsep.join(d for d in path.split(os.pathsep)
                           if os.path.isabs(d) and not _within(os.path.realpath(d), root))


def _options(args: list[str]) -> list[str]:
    """The option words of `args` (before a `--`)."""
    words = args[: args.index("--")] if "--" in args else args
    return [w for w in words if w.startswith("-") and w != "-"]


def _positionals(args: list[str]) -> list[str]:
    if "--" in args:
        i = args.index("--")
        return [w for w in args[:i] if not w.startswith("-") or w == "-"] + args[i + 1:]
    return [w for w in args if not w.startswith("-") or w == "-"]


def _runs_code(program: str, sub: str | None, options: list[str]) -> bool:
    longs, shorts = EXEC_OPTIONS.get(program, ((), ""))
    if program == "git":
        shorts += GIT_EXEC_SHORT.get(sub or "", "")
    for word in options:
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if len(name) > 2 and any(o.startswith(name) for o in longs):
                return True
        elif any(c in shorts for c in word[1:]):
            return True
    return False


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _inside(word: str, workspace: Path) -> bool:
    """Whether `word`, as a path, names something inside the workspace, links resolved (no glob, no `~`)."""
    if any(c in word for c in "~*?["):
        return False
    return _within(os.path.realpath(Path(workspace, word)), os.path.realpath(workspace))


def rule_of(words: list[str], workspace: Path) -> list[str] | None:
    """The rule `always` makes of a command (its words), or None where no rule is offered (the module's
    docstring says which). The rule is the words a later command is matched against (`covers`)."""
    if not words or ASSIGNMENT.match(words[0]) or "/" in words[0]:
        return None
    program, args = words[0], words[1:]
    if _is(program, INTERPRETERS + LAUNCHERS + PACKAGE_MANAGERS) or resolves_inside(program, workspace):
        return None
    if program == "git":
        if not args or args[0].startswith("-") or args[0] in GIT_NEVER or _runs_code("git", args[0], _options(args[1:])):
            return None  # an option before the subcommand (`git -c ...`): the rule would stop before it
        return ["git", args[0], *_options(args[1:])] if args[0] in GIT_ANY_ARGUMENTS else words
    if args and args[0] in FETCHES.get(program, ()):
        return None
    if _runs_code(program, None, _options(args)):
        return None
    return [program, *_options(args)] if program in READ_ONLY else words


def _shape(rule: list[str]) -> str:
    if rule[0] == "git" and rule[1] in GIT_ANY_ARGUMENTS:
        return "any arguments"
    return "paths" if rule[0] in READ_ONLY else "exact"


def prefix_of(command: str, workspace: Path) -> str | None:
    """What `always` approves for `command`, as the request shows it (None: not offered)."""
    words = words_of(command)
    rule = rule_of(words, workspace) if words else None
    if rule is None:
        return None
    shape = _shape(rule)
    if shape == "exact":
        return shlex.join(rule)
    return shlex.join(rule) + (" … (the same options; paths inside the workspace)" if shape == "paths"
                               else " … (the same options; any paths and message)")


def covers(rule: list[str], command: str, workspace: Path) -> bool:
    """Whether an `always` rule approves `command`: one command with a rule of its own, the same words
    (an exact rule), or the same program, subcommand and options (in any order) with the rest as the
    rule's shape allows."""
    words = words_of(command)
    if not words or rule_of(words, workspace) is None:
        return False
    shape = _shape(rule)
    if shape == "exact":
        return words == rule
    head = 2 if shape == "any arguments" else 1
    if words[:head] != rule[:head] or sorted(_options(words[head:])) != sorted(rule[head:]):
        return False
    return shape == "any arguments" or all(_inside(w, workspace) for w in _positionals(words[1:]))
