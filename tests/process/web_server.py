"""Run walqueue-web as a real subprocess for tests, and always stop it (by pid).

It listens on 127.0.0.1:0; the port is read from its log line "serving ... at
http://127.0.0.1:PORT/", awaited with a deadline, never by sleeping a guess.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .daemon import child_env

START_SECONDS = 20.0
STOP_SECONDS = 10.0
_SERVING = re.compile(r"serving .* at (https?://127\.0\.0\.1:\d+)/")


class WebServer:
    def __init__(self, workdir: Path, target: str, *args: str) -> None:
        self.log_path = workdir / f"web-{time.monotonic_ns()}.log"
        self.command = [sys.executable, "-m", "walqueue.web.cli", target, "--listen", "127.0.0.1:0",
                        *args]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> WebServer:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=child_env())
        deadline = time.monotonic() + START_SECONDS
        while True:
            found = _SERVING.search(self.log())
            if found and "Application startup complete" in self.log():
                self.url = found.group(1)
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"walqueue-web exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"walqueue-web did not start in {START_SECONDS} s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_SECONDS)
