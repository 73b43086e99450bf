"""Shared pytest configuration.

The tests run against src/ without installing. With WALQUEUE_BROKEN=<name>
in the environment the whole run uses a deliberately broken variant of the
library (tests/broken.py), which the suites are expected to catch.
"""

import contextlib
import os
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

_broken = contextlib.ExitStack()


def pytest_configure(config):
    name = os.environ.get("WALQUEUE_BROKEN")
    if name:
        from tests import broken

        _broken.enter_context(broken.active(name))


def pytest_report_header(config):
    name = os.environ.get("WALQUEUE_BROKEN")
    return f"WALQUEUE_BROKEN={name}: running against a deliberately broken library" if name else None


def pytest_unconfigure(config):
    _broken.close()
