"""Imported as a kernel starts (IPKernelApp.exec_lines): the kernel exits when the process that
launched it does, however it died. The host holds the only write end of a pipe whose read end the
kernel inherits (its number in PRIME_AGENT_LIFELINE); the read returns when that end closes.
ipykernel's own parent poller cannot do this in a sandbox, where the kernel's parent is the PID
namespace's init. Standard library only."""

import os
import threading


def _watch(fd: int) -> None:
    try:
        os.read(fd, 1)  # nothing is ever written: this returns when the host's end closes
    except OSError:
        pass
    os._exit(70)


_fd = os.environ.pop("PRIME_AGENT_LIFELINE", "")
if _fd.isdigit():
    threading.Thread(target=_watch, args=(int(_fd),), daemon=True, name="prime-agent-lifeline").start()
