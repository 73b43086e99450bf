"""TEST ONLY: the kill hook, inside a walqueued running a deliberately broken library.

``--test-hook tests.process.broken_hook:hook`` with ``WALQUEUE_BROKEN=<name>``
in the daemon's environment patches the variant ``name`` of tests/broken.py
into the daemon's process when walqueued loads the hook (before it opens its
Queue), and keeps it for the life of the process; the hook itself is
tests/process/kill_hook.py's. The crash harness uses it to show that real
kills catch a broken library, not only that they pass a working one.
"""

from __future__ import annotations

import contextlib
import os

from tests import broken

from .kill_hook import hook

_variant = contextlib.ExitStack()
if os.environ.get("WALQUEUE_BROKEN"):
    _variant.enter_context(broken.active(os.environ["WALQUEUE_BROKEN"]))

__all__ = ["hook"]
