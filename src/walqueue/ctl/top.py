"""walqueue-ctl top: a live view of walqueued, redrawn every second from its DaemonStats.

What is shown is a pure function of two samples: `figures(previous, current)`
computes the counts and the per-second rates between them (over the daemon's
own uptime, so a slow answer does not skew them; none across a daemon
restart), and `frame(figures)` lays them out as lines of text. `run()` is
the only part that does I/O: it samples, draws (in place on a terminal, one
frame after another when piped, JSON lines with --json) and waits for the
next refresh on the keyboard, so `q` quits at once; Ctrl-C and SIGTERM quit
as cleanly, with the terminal restored.

Standard library only (termios and select for the keyboard).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from walqueue import display
from walqueue.metrics import DaemonStats

# The terminal's alternate screen (the view leaves the scrollback as it was),
# the cursor hidden meanwhile, and redrawing in place.
ENTER_SCREEN = "\x1b[?1049h\x1b[?25l"
LEAVE_SCREEN = "\x1b[?25h\x1b[?1049l"
HOME = "\x1b[H"
CLEAR_LINE_END = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
QUIT_KEYS = b"qQ"


def figures(previous: DaemonStats | None, current: DaemonStats) -> dict[str, Any]:
    """The view's figures: counts from `current`, rates since `previous` (None without one)."""
    queue = current.queue
    elapsed = None
    if previous is not None and previous.start_time_seconds == current.start_time_seconds:
        elapsed = current.uptime_seconds - previous.uptime_seconds
        if elapsed <= 0:
            elapsed = None

    def rate(now_value: int, then_value: int) -> float | None:
        return None if elapsed is None else max(0, now_value - then_value) / elapsed

    def total(report: DaemonStats) -> int:
        # Tasks are never deleted, so the growth of the total counts puts.
        return report.queue.ready + report.queue.leased + report.queue.completed + report.queue.dead

    return {
        "directory": current.directory,
        "paused": current.paused,
        "uptime_seconds": current.uptime_seconds,
        "ready": queue.ready,
        "leased": queue.leased,
        "completed": queue.completed,
        "dead": queue.dead,
        "puts_per_second": rate(total(current), total(previous)) if previous else None,
        "completions_per_second": rate(queue.completed, previous.queue.completed) if previous else None,
        "requests_per_second": rate(current.requests_total, previous.requests_total) if previous else None,
        "fsyncs_per_second": rate(current.fsyncs_total, previous.fsyncs_total) if previous else None,
        "oldest_ready_age_seconds": current.oldest_ready_age_seconds,
        "leases_past_half": current.leases_past_half,
        "fsync_p50_seconds": current.fsync_p50_seconds,
        "fsync_p99_seconds": current.fsync_p99_seconds,
        "requests_per_fsync": current.requests_per_fsync,
        "connections": current.connections,
        "parked_reserves": current.parked_reserves,
        "wal_bytes": queue.wal_bytes,
        "wal_segments": current.wal_segments,
        "compactions_total": current.compactions_total,
        "write_failures_total": current.write_failures_total,
        "slow_turns_total": current.slow_turns_total,
        "longest_turn_seconds": current.longest_turn_seconds,
        "rate_seconds": elapsed,
    }


def duration_text(seconds: float) -> str:
    """A duration as an operator reads it (walqueue.display.duration), its zero remainder kept."""
    return display.duration(seconds, zero_remainder=True)


def due_text(available_at: int, now: int) -> str:
    """When a ready task is due, from `now`: "now", or "in 42 s"."""
    return "now" if available_at <= now else f"in {duration_text(available_at - now)}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}/s"


def _milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.3g} ms"


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def frame(figures: dict[str, Any], *, interval: float = 1.0, error: str | None = None) -> list[str]:
    """The lines of one view, from `figures()`; `error` says why they are not fresh."""
    f = figures
    paused = "   PAUSED: reserves get nothing" if f["paused"] else ""
    per_fsync = "-" if f["requests_per_fsync"] is None else f"{f['requests_per_fsync']:.1f}"
    segments = f"{f['wal_segments']} segment" + ("" if f["wal_segments"] == 1 else "s")
    lines = [
        f"walqueued {display.name(f['directory'])}   up {duration_text(f['uptime_seconds'])}{paused}",
        f"tasks     ready {f['ready']}   leased {f['leased']}   completed {f['completed']}   "
        f"dead {f['dead']}",
        f"rates     put {_rate(f['puts_per_second'])}   completed {_rate(f['completions_per_second'])}"
        f"   requests {_rate(f['requests_per_second'])}   fsyncs {_rate(f['fsyncs_per_second'])}",
        f"waiting   oldest ready {duration_text(f['oldest_ready_age_seconds'])}   "
        f"leases past half {f['leases_past_half']}",
        f"fsync     p50 {_milliseconds(f['fsync_p50_seconds'])}   "
        f"p99 {_milliseconds(f['fsync_p99_seconds'])}   requests/fsync {per_fsync}   "
        f"turns over 100 ms {f['slow_turns_total']} (longest {_milliseconds(f['longest_turn_seconds'])})",
        f"daemon    connections {f['connections']}   parked reserves {f['parked_reserves']}   "
        f"WAL {_bytes(f['wal_bytes'])} in {segments}   compactions {f['compactions_total']}   "
        f"write failures {f['write_failures_total']}",
        "",
    ]
    if error is not None:
        lines.append(f"NOT CURRENT: {display.text(error)}; retrying")
    lines.append(f"q quits · every {interval:g} s")
    return lines


class Keyboard:
    """Waits for the next refresh on the keyboard (cbreak mode), so a key acts at once.

    Without a terminal on stdin it only waits.
    """

    def __init__(self, stream: TextIO) -> None:
        try:
            self.fd: int | None = stream.fileno() if stream.isatty() else None
        except (AttributeError, OSError, ValueError):
            self.fd = None  # e.g. a test runner's stand-in for stdin
        self._saved: list | None = None

    def __enter__(self) -> Keyboard:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)  # keys arrive one by one; Ctrl-C still sends SIGINT
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def quit_within(self, seconds: float) -> bool:
        """Wait up to `seconds`; True as soon as q is pressed."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.fd is None:
                time.sleep(remaining)  # the refresh period itself: nothing else to wait for
                return False
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return False
            keys = os.read(self.fd, 64)
            if not keys:
                self.fd = None  # end of input: no keyboard any more, keep refreshing
            elif any(key in QUIT_KEYS for key in keys):
                return True
        return False


@contextlib.contextmanager
def _quit_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the view like Ctrl-C, so the terminal is restored."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(first: DaemonStats, sample: Callable[[], DaemonStats | str], *, interval: float,
        count: int | None = None, as_json: bool = False, stdin: TextIO | None = None,
        stdout: TextIO | None = None) -> None:
    """Show the view until q, Ctrl-C, SIGTERM or `count` refreshes.

    `sample()` returns a new report, or a string saying why there is none
    (the view then shows the last one, marked, and tries again).
    """
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    on_screen = not as_json and stdout.isatty()
    previous, current, error = None, first, None
    shown = 0
    next_refresh = time.monotonic()
    try:
        with Keyboard(stdin) as keyboard, _quit_on_sigterm():
            if on_screen:
                stdout.write(ENTER_SCREEN)
            try:
                while True:
                    current_figures = figures(previous, current)
                    if as_json:
                        record = {**current_figures, "error": error}
                        stdout.write(display.json_line(record) + "\n")
                    elif on_screen:
                        width = shutil.get_terminal_size().columns
                        lines = frame(current_figures, interval=interval, error=error)
                        stdout.write(HOME + "".join(line[:width] + CLEAR_LINE_END + "\n"
                                                    for line in lines) + CLEAR_BELOW)
                    else:
                        stdout.write("\n".join(frame(current_figures, interval=interval,
                                                     error=error)) + "\n\n")
                    stdout.flush()
                    shown += 1
                    if count is not None and shown >= count:
                        return
                    next_refresh = max(next_refresh + interval, time.monotonic())
                    if keyboard.quit_within(next_refresh - time.monotonic()):
                        return
                    answer = sample()
                    if isinstance(answer, str):
                        error = answer
                    else:
                        previous, current, error = current, answer, None
            finally:
                if on_screen:
                    stdout.write(LEAVE_SCREEN)
                    stdout.flush()
    except KeyboardInterrupt:
        return
