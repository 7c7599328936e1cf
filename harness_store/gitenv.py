"""Git as the host runs it in a repository a kernel could reach: inert.

Every git command the host runs (the harness scopes here, the checkpoint store in agent/) gets
`inert_env()`: no system or global config, nothing of the host's environment but the locale and
PATH (no `GIT_*`, no secrets), and config given on the command line's level, which beats any
repository's own: no hooks, no fsmonitor, no attributes file, no pager, editor, ssh or transport.
What the command line cannot switch off by name (a `filter.<driver>`, `diff.<driver>.textconv`,
`merge.<driver>.driver`, an `include.path`) is refused where it could come from: `foreign()`
refuses a scope whose repository's config holds anything but the few keys a harness repository
has, or whose `.git` holds hooks, is a link, or points elsewhere.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

INERT_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.attributesFile", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("core.sshCommand", "false"),
    ("protocol.allow", "never"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)
"""Config at the command line's level (`GIT_CONFIG_COUNT`): it wins over the repository's config."""
PASSED = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
"""The only variables of the host's environment git sees."""
ALLOWED_KEYS = re.compile(
    r"(?i)(core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|symlinks)"
    r"|user\.(name|email)|gc\.auto|init\.defaultbranch"
    r"|remote\..+\.(url|pushurl|fetch)|branch\..+\.(remote|merge|rebase))"
)
"""What a harness repository's own config may hold: what `git init` writes, an identity, a remote a
person pushes to by hand. Nothing here names a command."""


GIT_IDENTITY = ("-c", "user.name=prime-agent", "-c", "user.email=prime-agent@localhost", "-c", "commit.gpgsign=false")
GITIGNORE = "*.swp\n*~\n.#*\n*.tmp\n.harness.lock\n__pycache__/\n*.pyc\n"
GITATTRIBUTES = (
    "# Every file is kept byte for byte (no line-ending conversion); what skills ship in binary\n"
    "# formats gets no text diff (`harness diff` says the file changed).\n"
    "* -text\n"
    + "".join(f"*.{ext} binary\n" for ext in (
        "ttf otf woff woff2 eot pdf png jpg jpeg gif webp ico bmp tif tiff psd mp3 mp4 wav ogg webm "
        "zip gz tgz tar bz2 xz zst 7z jar whl so dylib dll exe bin pkl npy npz pt onnx sqlite db "
        "docx xlsx pptx odt ods odp").split())
)

SYSTEM_BIN = ("/usr/bin", "/bin", "/usr/local/bin")
"""Where the host looks for git first: folders no kernel can write."""


@functools.cache
def git_program() -> str:
    """The git the host runs, found once a process: in SYSTEM_BIN first, then in PATH's absolute
    entries. Never by a bare `git` looked up in PATH, which may name a folder of the workspace (an
    activated project `.venv/bin`, a relative `bin`) where a cell could plant a `git` of its own."""
    return (shutil.which("git", path=os.pathsep.join(SYSTEM_BIN))
            or shutil.which("git", path=os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                                          if os.path.isabs(p))) or "git")


def inert_env(**extra: str) -> dict[str, str]:
    """The environment of every host-side git command (`extra`: e.g. `GIT_INDEX_FILE`); its PATH is
    the folder of `git_program()` alone, so git finds no program of the workspace either."""
    env = {k: os.environ[k] for k in PASSED if k in os.environ}
    env["PATH"] = os.pathsep.join(dict.fromkeys([os.path.dirname(git_program()) or "/usr/bin", *SYSTEM_BIN]))
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0",
               GIT_NO_REPLACE_OBJECTS="1", GIT_CONFIG_COUNT=str(len(INERT_CONFIG)))
    for n, (key, value) in enumerate(INERT_CONFIG):
        env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
    env.update(extra)
    return env


def run_git(args: list[str], cwd: Path, input: bytes | None = None, **env: str) -> subprocess.CompletedProcess[bytes]:
    """One inert git command (its output as bytes; the caller checks the return code)."""
    return subprocess.run([git_program(), *args], cwd=cwd, input=input, capture_output=True, env=inert_env(**env))


def foreign(root: Path) -> str | None:
    """Why the repository at `root/.git` is not one the host made and may run git in, or None."""
    git_dir = root / ".git"
    where = f"the harness repository {git_dir}"
    try:
        st = os.lstat(git_dir)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is not a folder (a link or a file pointing elsewhere)"
    if os.path.lexists(git_dir / "commondir"):
        return f"{where} borrows another repository's (it has a `commondir`)"
    config = git_dir / "config"
    if not os.path.lexists(config) or not stat.S_ISREG(os.lstat(config).st_mode):
        return f"{where} has no config file of its own"
    hooks = git_dir / "hooks"
    if os.path.lexists(hooks):
        if not stat.S_ISDIR(os.lstat(hooks).st_mode):
            return f"{where} has a `hooks` that is not a folder"
        planted = sorted(n for n in os.listdir(hooks) if not n.endswith(".sample"))
        if planted:
            return f"{where} has hooks prime-agent never writes: {', '.join(planted)}"
    done = run_git(["config", "--file", str(config), "--no-includes", "--list", "-z"], root)
    if done.returncode != 0:
        return f"{where} has a config git cannot read: {done.stderr.decode(errors='replace').strip()}"
    for item in filter(None, done.stdout.split(b"\0")):
        key = item.split(b"\n", 1)[0].decode(errors="replace")
        if not ALLOWED_KEYS.fullmatch(key):
            return f"{where} sets `{key}` in its config, which prime-agent never writes"
    return None


def fingerprint(root: Path) -> tuple:
    """What `foreign()` looked at, as it is now (unchanged: the verdict stands, without running git)."""
    out = []
    for rel in (".git", ".git/config", ".git/hooks", ".git/commondir"):
        try:
            st = os.lstat(root / rel)
        except OSError:
            out.append(None)
            continue
        # `.git` itself by identity alone: every commit changes its times (a lock file comes and goes)
        out.append((st.st_mode, st.st_ino) if rel == ".git" else
                   (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def parse_batch(out: bytes) -> dict[str, bytes]:
    """The objects of `git cat-file --batch` output, by id."""
    blobs, at = {}, 0
    while at < len(out):
        end = out.index(b"\n", at)
        sha, _, size = out[at:end].decode().split(" ")
        at = end + 1
        blobs[sha] = out[at:at + int(size)]
        at += int(size) + 1
    return blobs
