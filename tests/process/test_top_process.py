"""walqueue-ctl top in a pseudo-terminal against a real walqueued: it draws the
view on the alternate screen, and q or Ctrl-C ends it at once with exit 0,
the terminal restored (cursor shown, screen left, the line discipline as it
was). Every read has a deadline; the process is killed by pid if it hangs.
"""

import os
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from walqueue.ctl import top

from .daemon import REPO, child_env, sigint_at_its_default
from .test_ctl_process import ctl

DRAW_SECONDS = 15.0
QUIT_SECONDS = 5.0


def read_until(master: int, text: bytes, seconds: float, seen: bytes = b"") -> bytes:
    """Read the terminal's output until `text` appears; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while text not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {text!r} on the terminal within {seconds} s; got {seen[-2000:]!r}")
        ready, _, _ = select.select([master], [], [], remaining)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"the terminal closed before {text!r}; got {seen[-2000:]!r}")
            seen += chunk
    return seen


def wait_reading(process: subprocess.Popen, master: int, seconds: float) -> tuple[int | None, bytes]:
    """Wait for `process` to exit, reading the terminal meanwhile; (exit code or None, what was read).

    A terminal nobody reads fills up, and a view that refreshes would then
    block writing its next frame (or the screen it leaves on quitting).
    """
    deadline = time.monotonic() + seconds
    seen = b""
    while process.poll() is None and (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([master], [], [], min(remaining, 0.05))
        if ready:
            try:
                seen += os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                pass
    return process.poll(), seen


def controlling_terminal() -> None:
    # In the child, after setsid(): make stdin (the pty) its controlling
    # terminal, so Ctrl-C on it becomes SIGINT for the child.
    import fcntl

    sigint_at_its_default()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize("key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_top_draws_the_view_and_quits_cleanly_on_a_key(daemon, key):
    assert ctl("--socket", daemon.socket_path, "put", "a").returncode == 0
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    process = subprocess.Popen(
        [sys.executable, "-m", "walqueue.ctl", "--socket", daemon.socket_path, "top",
         "--interval", "0.2"],
        stdin=slave, stdout=slave, stderr=slave, env=child_env({"TERM": "xterm"}), cwd=REPO,
        start_new_session=True, preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        seen = read_until(master, b"tasks     ready 1", DRAW_SECONDS)
        assert seen.startswith(top.ENTER_SCREEN.encode())
        seen = read_until(master, b"q quits", DRAW_SECONDS, seen)  # a whole frame is out
        os.write(master, key)
        code, more = wait_reading(process, master, QUIT_SECONDS)
        assert code == 0
        seen += more
        try:
            seen += os.read(master, 65536)
        except OSError:
            pass  # nothing more to read
        assert seen.endswith(top.LEAVE_SCREEN.encode())
        assert b"Traceback" not in seen
        assert termios.tcgetattr(master)[3] & termios.ICANON == before[3] & termios.ICANON
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(QUIT_SECONDS)
        os.close(master)
