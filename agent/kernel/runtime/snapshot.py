"""The kernel's side of namespace checkpoints: save the user namespace, restore it.

`save` forks: the child pickles (cloudpickle) and writes while the kernel goes straight on, so a
snapshot costs the turn boundary a fork, not the pickling. Each variable is its own
content-addressed blob (an unchanged variable is stored once however many turns keep it); a
manifest, written last, names them. What cannot be kept is listed with the reason: an object
that does not pickle, one over the per-variable or total cap. Modules are re-imported by name.
Restore replaces the user namespace with the snapshot's (or an empty one) and prints a summary
as JSON for the host.

The user namespace is everything but names starting with `_`, IPython's own (`In`, `Out`, ...)
and what `agent.kernel.runtime` binds (`final`, `harness`, `read`, ...).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import signal
import threading
import time
import types

CHILD_SECONDS = 120
"""A snapshot child still running after this long is stopped (a pickler stuck on a lock some
thread held at the fork): its snapshot is missing, and a rewind to it says so."""


def user_names(namespace: dict) -> list[str]:
    hidden: set = set()
    try:
        from IPython import get_ipython

        shell = get_ipython()
        hidden = set(shell.user_ns_hidden) if shell is not None else set()
    except ImportError:
        pass
    return [name for name, value in namespace.items()
            if not name.startswith("_") and name not in hidden and not _runtime(value)]


def _runtime(value) -> bool:
    """Bound by agent.kernel.runtime (its helpers and their instances): the bootstrap brings them back."""
    own = isinstance(value, type | types.FunctionType)
    module = getattr(value, "__module__", None) if own else type(value).__module__
    return isinstance(module, str) and (module == "agent.kernel.runtime" or module.startswith("agent.kernel.runtime."))


def save(namespace: dict, directory: str, name: str, max_variable: int, max_total: int) -> None:
    """Write the snapshot `name` under `directory`, from a forked child (inline where fork fails).
    A directory it cannot write to raises here, in the kernel, before any fork."""
    os.makedirs(os.path.join(directory, "blobs"), exist_ok=True)
    probe = os.path.join(directory, f".probe-{os.getpid()}")
    with open(probe, "wb"):
        pass
    os.remove(probe)
    try:
        pid = os.fork()
    except (OSError, AttributeError):
        pid = -1
    if pid > 0:
        threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True, name="snapshot-reaper").start()
        return
    if pid == 0:  # the child: never return into the kernel, never touch its sockets
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt of the kernel is not ours
            signal.alarm(CHILD_SECONDS)
            _write_or_say(namespace, directory, name, max_variable, max_total)
            code = 0
        finally:
            os._exit(code)
    _write_or_say(namespace, directory, name, max_variable, max_total)


def _write_or_say(namespace: dict, directory: str, name: str, max_variable: int, max_total: int) -> None:
    """The snapshot, or a manifest that says why there is none (a rewind to it then says so at once)."""
    try:
        write(namespace, directory, name, max_variable, max_total)
    except BaseException as e:  # noqa: BLE001 - a full disk, a missing cloudpickle: said, not raised
        try:
            _write_file(os.path.join(directory, f"{name}.json"),
                        json.dumps({"error": f"{type(e).__name__}: {str(e)[:300]}"}).encode())
        except OSError:
            pass


def write(namespace: dict, directory: str, name: str, max_variable: int, max_total: int) -> dict:
    import cloudpickle

    started = time.monotonic()
    blobs = os.path.join(directory, "blobs")
    os.makedirs(blobs, exist_ok=True)
    manifest: dict = {"variables": {}, "modules": {}, "skipped": {}}
    total = 0
    for var in user_names(namespace):
        value = namespace[var]
        if isinstance(value, types.ModuleType):
            manifest["modules"][var] = value.__name__
            continue
        try:
            data = cloudpickle.dumps(value, protocol=5)
        except BaseException as e:  # noqa: BLE001 - any object's __reduce__ may raise anything
            manifest["skipped"][var] = f"not serialisable ({type(e).__name__}: {str(e)[:120]})"
            continue
        if len(data) > max_variable:
            manifest["skipped"][var] = f"{len(data):,} bytes pickled, over checkpoints.max_variable_bytes"
            continue
        if total + len(data) > max_total:
            manifest["skipped"][var] = "over checkpoints.max_namespace_bytes with the variables before it"
            continue
        total += len(data)
        digest = hashlib.sha256(data).hexdigest()
        path = os.path.join(blobs, digest)
        if not os.path.exists(path):
            _write_file(path, data)
        manifest["variables"][var] = {"blob": digest, "type": type(value).__name__, "bytes": len(data)}
    manifest["bytes"], manifest["duration"] = total, time.monotonic() - started
    _write_file(os.path.join(directory, f"{name}.json"), json.dumps(manifest).encode())
    return manifest


def _write_file(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def restore(namespace: dict, directory: str, name: str) -> None:
    """Replace the user namespace with snapshot `name` ("" for an empty one); print what happened."""
    import pickle

    manifest = {"variables": {}, "modules": {}, "skipped": {}}
    if name:
        with open(os.path.join(directory, f"{name}.json")) as f:
            manifest = json.load(f)
    kept = {*manifest["variables"], *manifest["modules"], *manifest["skipped"]}
    removed = [var for var in user_names(namespace) if var not in kept]  # made after the snapshot
    for var in removed:
        del namespace[var]
    restored, failed = [], dict(manifest["skipped"])
    for var, module in manifest["modules"].items():
        try:
            namespace[var] = importlib.import_module(module)
            restored.append(var)
        except BaseException as e:  # noqa: BLE001
            failed[var] = f"module {module} could not be imported again ({type(e).__name__}: {e})"
    for var, info in manifest["variables"].items():
        try:
            with open(os.path.join(directory, "blobs", info["blob"]), "rb") as f:
                namespace[var] = pickle.loads(f.read())
            restored.append(var)
        except BaseException as e:  # noqa: BLE001
            failed[var] = f"could not be loaded ({type(e).__name__}: {str(e)[:120]})"
    for var in failed:
        namespace.pop(var, None)  # a name that was not restored is not left holding a later value
    print(json.dumps({"restored": sorted(restored), "modules": sorted(manifest["modules"]),
                      "not_restored": failed, "removed": sorted(removed)}))
