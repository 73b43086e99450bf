"""What the benchmark scripts share about the processes they start. Not a test."""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen, grace_seconds: float = 30.0) -> None:
    """SIGTERM, and SIGKILL if `proc` has not exited within `grace_seconds`; every wait bounded."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
