"""Two tests that wait until they are interrupted, for scripts/test's own Ctrl-C test
(tests/process/test_scripts.py). Not collected by a normal run (the name is not test_*.py).

Each writes its pid into $WALQUEUE_INTERRUPT_DIR/NAME once running, then waits: at most
WAIT_SECONDS, a bound only (the test interrupts it long before)."""

import os
import threading
from pathlib import Path

WAIT_SECONDS = 300.0


def announce_and_wait(name: str) -> None:
    # Written whole, then renamed into place: the test reads the file as soon as it exists
    # (CI once read it between its creation and its write, and found it empty).
    directory = Path(os.environ["WALQUEUE_INTERRUPT_DIR"])
    (directory / f".{name}").write_text(str(os.getpid()))
    (directory / f"{name}.extensions").write_text(os.environ.get("WALQUEUE_NO_EXTENSIONS", ""))
    os.replace(directory / f".{name}", directory / name)
    threading.Event().wait(WAIT_SECONDS)


def test_beside():
    announce_and_wait("beside")


def test_inline():
    announce_and_wait("inline")
