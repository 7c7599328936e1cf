"""The kernel's entry point, in place of ipykernel_launcher: ipykernel's own app, whose IOPub socket
never drops a message. IOPub is a publisher, and a publisher drops what is past its high-water mark
(1,000 messages by default) when its subscriber reads slower than a cell prints: on a loaded host
5,000 flushed prints lost ~240 of them from the middle of a cell's output. The host's end holds
everything it is sent (RCVHWM 0, agent/kernel/manager.py); with SNDHWM 0 here too, what a cell
prints waits in the kernel until the host reads it. A cell's output per stream is bounded anyway
(`kernel.output_spill`, runtime/streams.py)."""

import sys
from pathlib import Path


def main() -> None:
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]  # the workspace, put back by IPython as ipykernel_launcher does
    import zmq
    from ipykernel.kernelapp import IPKernelApp

    class App(IPKernelApp):
        def init_iopub(self, context: zmq.Context) -> None:
            context.setsockopt(zmq.SNDHWM, 0)  # the sockets made from here on: IOPub's publisher first
            super().init_iopub(context)

    App.launch_instance()


if __name__ == "__main__":
    main()
