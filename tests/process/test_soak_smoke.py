"""scripts/soak.py, run for a few seconds: the harness works end to end and says PASS."""

import os
import signal
import subprocess
import sys

from .daemon import REPO, child_env

SOAK_SECONDS = 8
TIMEOUT_SECONDS = 120


def test_a_short_soak_with_kills_and_compactions_passes_the_checker():
    command = [sys.executable, "scripts/soak.py", "--seconds", str(SOAK_SECONDS), "--workers", "4",
               "--kill-every", "3", "--sample-every", "2", "--compact-wal-bytes", "65536",
               "--tombstones", "2000", "--seed", "7"]
    # Its own process group, so a hung soak is stopped with every child it started.
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=child_env(), cwd=REPO, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=10)
        raise AssertionError(f"soak.py ran past {TIMEOUT_SECONDS} s:\n{output}") from None
    lines = output.strip().splitlines()
    assert process.returncode == 0, output
    assert lines[-1].startswith("soak verdict: PASS — checker: 0 violation(s)"), output
    assert " 0 kills" not in lines[-1], output  # the daemon was SIGKILLed and restarted
    assert any(line.startswith("tombstones (library only):") and "bytes per tombstone" in line
               for line in lines), output
    assert sum(" rss " in line and "ok ops/s" in line for line in lines) >= 3, output
