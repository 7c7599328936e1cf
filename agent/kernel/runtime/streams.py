"""Standard streams that a cell broke, put back around every cell.

A cell that closes `sys.stdout` (or sets it to None, or closes file descriptor 1) used to leave the
kernel mute for the rest of the session: every print raised, `%%bash` output was lost, and a cell
that left `sys.stdout` a closed file hung until its timeout restarted the kernel (ipykernel flushes
`sys.stdout` after each cell, outside any handler). `guard_streams()` checks stdin, stdout and stderr
before and after every cell and repairs what is broken; each repair is told once on the kernel's
stderr, e.g. `[the runtime restored sys.stdout, which had been closed]`, so the model knows why.

What is repaired, and what is left alone:
- `sys.stdout` / `sys.stderr` that are None, closed, or have no `write()`, and `sys.stdin` that is
  None, closed or has no `readline()`: the kernel's own stream is put back. A closed ipykernel
  OutStream is reopened in place (same object, bound to the kernel's IOPub thread again, its
  capture of the file descriptor set up again), so references taken earlier (`out = sys.stdout`,
  a logging handler) work again too.
- `sys.stdout = sys.__stdout__` (the usual "undo my redirect"): the kernel process's own stdout,
  which reaches the model only through ipykernel's capture of fd 1, if at all. The kernel's stream
  is put back, without a note: that is what the assignment meant.
- A closed file descriptor 0, 1 or 2 (`os.close(1)`): a copy of it taken at bootstrap is put back
  with dup2. Only a closed one: once something else has taken the number (the next `open` does),
  taking it back would close that file under its owner.
- An open stream a cell chose (`sys.stdout = open("log.txt", "w")`, an `io.StringIO`) is a
  deliberate redirect and stays, across cells, as Python would have it: the cell may mean it (a log
  of what follows), and taking it away would surprise code that relies on it. But a forgotten one
  mutes the model as surely as a closed stream, so it is told once (per redirect) where its output
  goes and how to get it back. A redirect inside one cell (`contextlib.redirect_stdout`,
  `%%capture`) has ended by the time the cell does and is never seen.

The check wraps the kernel's `do_execute` (the ipykernel method that runs a cell, overridden on the
instance) rather than using IPython's `pre_run_cell` event: IPython's `run_cell` reads
`sys.stdout.write` (to tee output into its history) before it fires any event, so a kernel whose
`sys.stdout` is None fails every cell before `pre_run_cell` could repair it; and the check after the
cell must run before ipykernel's own flush of `sys.stdout`, which hangs the kernel on a closed file.
When nothing is broken a check is three identity tests, three `closed` reads and three fstat calls:
2.6 us measured here, twice a cell, against a ~3 ms cell round trip.

A cell's output past `spill_after` characters per stream (`kernel.output_spill`) does not go to the
host at all: it is written to a file in the kernel's temp folder, and when the cell ends the stream
gets one note naming the file and the output's last 16,000 characters. Whatever a cell prints, the
host receives a few MB of it, so the daemon's memory stays bounded (a 200 MB print used to take it
from 72 to 702 MB); the host keeps less still (`kernel.output_limit`, head and tail).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import reprlib
import select
import sys
import tempfile
import threading
from typing import Any

STREAMS = (("stderr", 2), ("stdout", 1), ("stdin", 0))
"""stderr first: the notes are written to it."""
_repr = reprlib.Repr()
_repr.maxother = 120  # a file's repr in a note, name included


class _Fd:
    """Stands for `sys.<name>` while an OutStream sets up its capture of `fd`: it asks `sys.<name>.fileno()`."""

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


def _closed(stream: Any) -> bool:
    return getattr(stream, "closed", False) is True


def _broken(name: str, stream: Any) -> str | None:
    """Why `stream` cannot serve as `sys.<name>` ("" for sys.__stdout__/__stderr__), or None if it can."""
    if stream is None:
        return "set to None"
    if name != "stdin" and stream is getattr(sys, f"__{name}__", None):
        return ""
    method = "readline" if name == "stdin" else "write"
    try:
        if _closed(stream):
            return "closed"
        if not callable(getattr(stream, method, None)):
            return f"set to {_repr.repr(stream)}, which has no {method}()"
    except Exception as e:  # a stream whose `closed` raises is no stream
        return f"left unusable ({type(e).__name__})"
    return None


class StreamGuard:
    """The kernel's standard streams as bootstrap found them, and the repair of what a cell broke."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.streams = tuple((name, fd) for name, fd in STREAMS if getattr(sys, name, None) is not None)
        self.own: dict[str, Any] = {name: getattr(sys, name) for name, _ in self.streams}
        """The kernel's streams: ipykernel's OutStreams for stdout and stderr, the process's stdin."""
        self.pub_thread = {n: getattr(self.own[n], "pub_thread", None) for n in ("stdout", "stderr")}
        self.watched = {n: bool(getattr(self.own[n], "_should_watch", False)) for n in ("stdout", "stderr")}
        """Whether ipykernel captures the file descriptor too (it does, except under pytest)."""
        self.readers = {n: FdReader(self.own[n]) for n in ("stdout", "stderr") if self.watched[n]}
        self.spare = {fd: os.dup(fd) for _, fd in self.streams}
        """A copy of each standard file descriptor (not inherited by children), to put back a closed one."""
        self.noted: dict[str, int] = {}
        """id() of the open redirect last noted, per stream: each is told once."""

    def check(self) -> None:
        try:
            for name, fd in self.streams:
                own = self.own[name]
                if getattr(sys, name) is not own or own.closed:
                    break
                os.fstat(fd)
            else:
                return
        except (AttributeError, OSError):  # `del sys.stdout`; a closed file descriptor
            pass
        try:
            self.repair()
        except Exception:  # never keep a cell from running; say why in the kernel's log
            self.kernel.log.exception("the runtime could not repair the standard streams")

    def repair(self) -> None:
        notes: list[str] = []
        for name, fd in self.streams:
            try:
                os.fstat(fd)
            except OSError:
                os.dup2(self.spare[fd], fd)
                notes.append(f"reopened file descriptor {fd} ({name}), which had been closed")
        for name, fd in self.streams:
            current = getattr(sys, name, None)
            own = self.own[name]
            if current is own and not _closed(own):
                continue
            why = _broken(name, current) if hasattr(sys, name) else "deleted"
            if why is None:  # an open stream a cell chose: a deliberate redirect, kept
                ours = any(current is s for s in self.own.values())  # sys.stdout = sys.stderr: still heard
                if name != "stdin" and not ours and self.noted.get(name) != id(current):
                    self.noted[name] = id(current)
                    notes.append(f"sees sys.{name} redirected to {_repr.repr(current)}: what is written to it goes "
                                 f"there, not to you; `sys.{name} = sys.__{name}__` gives the kernel's {name} back")
                continue
            if _closed(own):
                self.reopen(name, fd)
            self.noted.pop(name, None)
            setattr(sys, name, self.own[name])
            if why:
                notes.append(f"restored sys.{name}, which had been {why}")
        err = self.own["stderr"]
        parent = self.kernel.get_parent("shell")
        for name in ("stdout", "stderr"):  # ipykernel set this cell's parent on sys.stdout, whatever that was
            if hasattr(self.own[name], "set_parent"):
                self.own[name].set_parent(parent)
        if notes:
            err.write("".join(f"[the runtime {note}]\n" for note in notes))
            err.flush()  # before the cell's own output, and even if sys.stderr is redirected

    def reopen(self, name: str, fd: int) -> None:
        """Make the kernel's closed `sys.<name>` usable again."""
        if name == "stdin":
            self.own[name] = open(fd, closefd=False)  # noqa: SIM115 - sys.stdin, never closed by us
            return
        # ipykernel 7.4's OutStream.close() unbinds it from the IOPub thread and, when it captured the
        # file descriptor, gives the descriptor back to what it was before the kernel started and ends
        # the thread that read it. Undo both; the object stays, so every reference to it works again.
        stream = self.own[name]
        stream.pub_thread = self.pub_thread[name]
        if self.watched[name]:
            setattr(sys, name, _Fd(fd))
            stream._should_watch = True
            stream._setup_stream_redirects(name)
            self.readers[name].start()
            os.close(self.spare[fd])
            self.spare[fd] = os.dup(fd)  # the new pipe: the old one has no reader any more


class FdReader:
    """The reader of the pipe that ipykernel puts in place of fd 1 (or 2), which can be drained: what
    a subprocess wrote there before a cell ended is that cell's output.

    ipykernel reads the pipe in a thread of its own, and nothing waits for it: on a loaded machine
    the thread ran after the cell's closing flush, and the output went out 200 ms after the cell was
    over, lost to the host, which had its result (a CI failure; 5 of 20 cells in a test that starves
    the thread). This reader takes a lock around each read and the `write` that passes it on, and
    `drain()`, after each cell and under the same lock, passes on what waits in the pipe: then every
    byte written before the drain began is in the stream's buffer, in order, for ipykernel's flush.
    It also decodes UTF-8 across reads (ipykernel cuts a character split between two reads in half).
    It replaces ipykernel's thread at bootstrap and whenever the stream sets up its capture again."""

    CHUNK = 1 << 16

    def __init__(self, stream: Any):
        self.stream = stream
        self.lock = threading.Lock()
        self.start()

    def start(self) -> None:
        """Stop ipykernel's reader as its own close() does (a byte wakes it, and it passes nothing on
        once `_should_watch` is false) and read in its place."""
        s = self.stream
        s._should_watch = False
        os.write(s._original_stdstream_fd, b"\0")
        s.watch_fd_thread.join()
        s._should_watch = True
        os.set_blocking(s._fid, False)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        s.watch_fd_thread = threading.Thread(target=self._run, args=(s._fid,), daemon=True, name=f"{s.name} reader")
        s.watch_fd_thread.start()

    def _run(self, fid: int) -> None:
        """Until the pipe ends or the stream's close() stops it (joining this thread)."""
        poll = select.poll()
        poll.register(fid, select.POLLIN)
        try:
            while True:
                poll.poll()
                with self.lock:
                    if not self._pass_on(fid):
                        return
        except Exception:
            self.stream._exc = sys.exc_info()  # printed by the stream's close(), as ipykernel does

    def _pass_on(self, fid: int, most: int = 1 << 62) -> bool:
        """Pass on up to about `most` bytes of what waits in the pipe (the caller holds the lock);
        False once the pipe has ended or the stream stopped watching."""
        s = self.stream
        while most > 0:
            try:
                data = os.read(fid, self.CHUNK)
            except BlockingIOError:
                return True
            if not data or not s._should_watch:
                return False
            most -= len(data)
            s.write(self.decoder.decode(data))
            with contextlib.suppress(OSError):  # echoed to the kernel's own fd, as ipykernel does; a closed
                os.write(s._original_stdstream_copy, data)  # one (EPIPE) never fails the cell that drains
        return True

    def drain(self) -> None:
        """What was written to the descriptor so far goes to the stream's buffer now; bounded, so a
        background process that never stops writing does not keep a cell from ending."""
        s = self.stream
        if s._should_watch and s._fid is not None:
            with self.lock:
                self._pass_on(s._fid, most=8 * self.CHUNK)


class Spill:
    """A stream's output past `after` characters in a cell goes to a file, its last `TAIL` kept for
    the note at the cell's end. Wraps the OutStream's `write`, which every write reaches: `print`,
    `sys.stdout.write`, and what ipykernel's capture of the file descriptor reads (subprocesses).
    Installed as each cell begins, beneath IPython's own wrapper (`run_cell` wraps `write` to keep
    output in its history, and puts back what it found when the cell ends)."""

    TAIL = 16_000
    CHUNK = 1 << 20

    def __init__(self, stream: Any, after: int):
        # the stream's own write, not what is bound now (IPython's wrapper of the bootstrap cell,
        # which would keep every later cell's output in that cell's history)
        self.stream, self.after, self.write = stream, after, type(stream).write.__get__(stream)
        self.lock = threading.Lock()  # ipykernel's file-descriptor reader writes from its own thread
        self.sent = 0
        self.file: Any = None
        self.spilled = 0
        self.tail = ""

    def install(self) -> None:
        self.stream.write = self.wrapped

    def wrapped(self, text: str) -> int | None:
        with self.lock:
            n = len(text)
            if self.file is None and self.sent + n <= self.after:
                self.sent += n
                return self.write(text)
            start = max(0, self.after - self.sent)
            if start:
                self.sent += start
                self.write(text[:start])
            try:
                if self.file is None:
                    folder = os.path.join(tempfile.gettempdir(), "outputs")
                    os.makedirs(folder, exist_ok=True)
                    self.file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed at the cell's end
                        "w", dir=folder, prefix="cell-", suffix=".txt", delete=False, encoding="utf-8",
                        errors="replace")
                for at in range(start, n, self.CHUNK):  # slices of a 200 MB string, not a copy of it
                    self.file.write(text[at:at + self.CHUNK])
            except OSError:  # a full disk: the rest is dropped (the note still counts it), never raised
                pass
            self.spilled += n - start
            self.tail = (self.tail + text[max(start, n - self.TAIL):])[-self.TAIL:]
            return n

    def end(self) -> None:
        """The cell ended: say where the rest went, with its tail, and start counting anew."""
        with self.lock:
            file, self.file, self.sent = self.file, None, 0
            if file is None:
                return
            file.close()
            note = (f"\n[... {self.spilled:,} more characters of this output are not shown; all of it past the "
                    f"first {self.after:,} characters is in {file.name} ...]\n")
            self.spilled, tail, self.tail = 0, self.tail, ""
        self.write(note + tail)


def guard_streams(spill_after: int = 0) -> None:
    """Check the standard streams before and after every cell (see the module's docstring), and
    spill each stream's output past `spill_after` characters a cell to a file (0: never)."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or getattr(kernel.do_execute, "stream_guard", None) is not None:
        return
    if not all(hasattr(getattr(sys, n, None), "pub_thread") for n in ("stdout", "stderr")):
        return  # not ipykernel's OutStreams: nothing of ours to restore
    guard = StreamGuard(kernel)
    spills = [Spill(guard.own[n], spill_after) for n in ("stdout", "stderr")] if spill_after > 0 else []
    execute = kernel.do_execute

    async def do_execute(*args, **kwargs):
        guard.check()
        for spill in spills:
            spill.install()
        try:
            return await execute(*args, **kwargs)
        finally:
            for reader in guard.readers.values():  # what a subprocess wrote to fd 1 or 2 is this cell's output
                reader.drain()
            guard.check()  # in the cell that broke a stream, before ipykernel flushes sys.stdout
            for spill in spills:
                spill.end()

    do_execute.stream_guard = guard  # type: ignore[attr-defined]
    kernel.do_execute = do_execute
