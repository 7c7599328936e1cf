"""The host's no-follow file access, for the agent layer: harness_store/safefs.py is the one
implementation (the harness store, the lowest layer, reads scope folders a kernel may have written)."""

from harness_store.safefs import (
    TMP_SUFFIX, UnsafePath, copy_file, read_bytes, read_text, rmdir, symlink, through_link, unlink, write_bytes,
)

__all__ = ["TMP_SUFFIX", "UnsafePath", "copy_file", "read_bytes", "read_text", "rmdir", "symlink", "through_link",
           "unlink", "write_bytes"]
