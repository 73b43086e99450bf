"""A bystander's latency while another client sends requests built to be costly to refuse.

    .venv/bin/python scripts/bench_hostile.py [--seconds 20] [--kinds empty_lists_put,...]

Starts walqueued on a scratch directory, runs a bystander process that puts,
reserves and acks in a loop (tests/process/hostile_requests.py), first alone
(the baseline), then while this process sends the hostile requests one after
another on fresh connections and reads each answer. Prints the bystander's
p50/p99/max per call for both phases, how long each hostile request took to
be answered, and the daemon's peak RSS. Issue 12 item 4 asks for a p99 under
50 ms while the hostile requests arrive.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.process.daemon import Daemon, child_env, read_message  # noqa: E402
from tests.process.hostile_requests import HOSTILE, quantile  # noqa: E402
from walqueue import protocol as p  # noqa: E402


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_bystander(socket_path: str, seconds: float) -> subprocess.Popen:
    # Its report goes to a file: a pipe would fill up before it is read.
    report = tempfile.TemporaryFile("w+")
    process = subprocess.Popen([sys.executable, "-m", "tests.process.hostile_requests", socket_path,
                                str(seconds)], stdout=report, env=child_env(), cwd=REPO, text=True)
    process.report = report
    return process


def bystander_report(process: subprocess.Popen) -> dict:
    process.wait(120 + 60)
    process.report.seek(0)
    return json.loads(process.report.read())


def summary(latencies: list[float]) -> str:
    milliseconds = [latency * 1000 for latency in latencies]
    return (f"calls {len(milliseconds)}, p50 {quantile(milliseconds, 0.5):.1f} ms, "
            f"p99 {quantile(milliseconds, 0.99):.1f} ms, max {max(milliseconds):.1f} ms")


def send_hostile(socket_path: str, frames: dict[str, bytes], stop: threading.Event, outcomes: list) -> None:
    request_id = 1
    while not stop.is_set():
        for kind, frame in frames.items():
            if stop.is_set():
                return
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(120)
                sock.connect(socket_path)
                sock.sendall(p.encode(p.Hello(id=0, version=p.PROTOCOL_VERSION)))
                read_message(sock)
                started = time.monotonic()
                sock.sendall(frame)
                answer = read_message(sock)
                outcomes.append((kind, time.monotonic() - started, answer))
            request_id += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--kinds", default=",".join(HOSTILE), help="hostile requests to send, comma-separated")
    options = parser.parse_args()
    kinds = [kind for kind in options.kinds.split(",") if kind]
    frames = {kind: HOSTILE[kind](7) for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="wq-bench-", dir="/tmp") as scratch:
        workdir = Path(scratch)
        daemon = Daemon(workdir, workdir / "queue", str(workdir / "wq.sock"), ("--log-level", "warning"))
        daemon.start()
        try:
            baseline_rss = rss_bytes(daemon.pid)
            alone = bystander_report(run_bystander(daemon.socket_path, options.seconds))
            print(f"bystander alone:            {summary(alone['latencies'])}, errors {alone['errors']}")
            stop, outcomes = threading.Event(), []
            sender = threading.Thread(target=send_hostile, args=(daemon.socket_path, frames, stop, outcomes))
            bystander = run_bystander(daemon.socket_path, options.seconds)
            sender.start()
            peak_rss = baseline_rss
            while bystander.poll() is None:
                peak_rss = max(peak_rss, rss_bytes(daemon.pid))
                time.sleep(0.05)
            stop.set()
            sender.join(300)
            attacked = bystander_report(bystander)
            print(f"bystander under the attack: {summary(attacked['latencies'])}, errors {attacked['errors']}")
            for kind in kinds:
                mine = [(seconds, answer) for name, seconds, answer in outcomes if name == kind]
                if not mine:
                    continue
                answers = {f"{type(answer).__name__}({getattr(answer, 'error', '')})" for _, answer in mine}
                print(f"  {kind}: sent {len(mine)} times, answered in max {max(s for s, _ in mine):.3f} s "
                      f"with {', '.join(sorted(answers))}")
            print(f"daemon RSS: {baseline_rss / 2**20:.1f} MiB at start, peak {peak_rss / 2**20:.1f} MiB")
        finally:
            daemon.terminate()
            daemon.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
