"""Which path runs the per-item hot paths: the compiled extension or the pure-Python reference.

The one place that decides (issue 22). `walqueue._speedups` is the project's
own C extension, built by `pip install` when a compiler is there (setup.py;
a failed build falls back with a warning). The pure-Python modules are the
reference and stay complete on their own: the extension replaces only the
frame walk of recovery (codec.scan_frames), the bulk load of snapshot
tombstones (snapshot, tombstones) and their encoding when a snapshot is
written, and the replay of put, reserve and ack records (replay: the twin
of State.apply, which the Engine also checks and commits those records
through) and the tombstone store's two lookups in a block, and it accepts
exactly what the reference accepts: whatever it cannot decide it leaves to
the reference, which then raises its own error.

WALQUEUE_NO_EXTENSIONS=1 in the environment forces the pure path (read once,
at import). `COMPILED` says which path runs, `PATH` says it in a word
("compiled" or "pure"), `EXTENSION_FILE` names the loaded extension (None on
the pure path), `SHA256` which SHA-256 code the extension uses.
"""

from __future__ import annotations

import importlib
import os

from .plain_entry import ENTRY

DISABLED = os.environ.get("WALQUEUE_NO_EXTENSIONS", "") == "1"

speedups = None
if not DISABLED:
    try:
        # By name: `from . import _speedups` reads to import-linter as importing the
        # package itself (the extension is no Python source), the whole library above.
        speedups = importlib.import_module("walqueue._speedups")
    except ImportError:
        speedups = None

COMPILED: bool = speedups is not None
PATH: str = "compiled" if COMPILED else "pure"
EXTENSION_FILE: str | None = getattr(speedups, "__file__", None)
SHA256: str | None = getattr(speedups, "SHA256_IMPLEMENTATION", None)

# The one `stop` pattern of codec.scan_frames the extension knows by heart
# (_speedups.c: match_entry is plain_entry.ENTRY written out by hand).
COMPILED_STOP = ENTRY
SCAN_LIMIT, SCAN_END, SCAN_ENTRY, SCAN_DEFER = (
    (speedups.SCAN_LIMIT, speedups.SCAN_END, speedups.SCAN_ENTRY, speedups.SCAN_DEFER)
    if COMPILED else (0, 1, 2, 3))


def describe() -> str:
    """One line for `--version` and logs: the path, and the extension's file when compiled."""
    if not COMPILED:
        why = "WALQUEUE_NO_EXTENSIONS=1" if DISABLED else "walqueue._speedups is not built"
        return f"speedups: pure ({why})"
    return f"speedups: compiled ({EXTENSION_FILE}, SHA-256 {SHA256})"
