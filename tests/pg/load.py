"""Run tests/pg/load_worker.py processes against one queue, and check what they did.

`Load(server_dsn, schema, workdir)` starts N worker processes (`start`),
waits for them with a bound (`wait`), always stops them by pid (`stop`), and
`check(dsn)` reads the final state through a Client and runs tests/pg/checker.
The DSN file is what workers read when they (re)connect; `point_at(dsn)`
rewrites it (failover).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.pg import checker
from tests.postgres import unique_name
from tests.process.daemon import REPO, child_env

WORKER_GRACE_SECONDS = 60.0


class Load:
    def __init__(self, dsn: str, schema: str, workdir: Path, *, queue: str | None = None) -> None:
        self.schema = schema
        self.queue = queue or unique_name("load")
        self.workdir = workdir
        self.dsn_file = workdir / "dsn"
        self.point_at(dsn)
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def point_at(self, dsn: str) -> None:
        temporary = self.dsn_file.with_suffix(".tmp")
        temporary.write_text(dsn)
        temporary.replace(self.dsn_file)

    def start(self, workers: int, seconds: float, seed: int) -> None:
        for number in range(workers):
            log = self.workdir / f"worker-{number}.log"
            self.logs.append(log)
            command = [sys.executable, "-m", "tests.pg.load_worker", "--dsn-file", str(self.dsn_file),
                       "--queue", self.queue, "--schema", self.schema, "--worker", f"w{number}",
                       "--seconds", str(seconds), "--seed", str(seed * 100 + number), "--log", str(log)]
            stderr = open(self.workdir / f"worker-{number}.err", "ab")
            self.processes.append(subprocess.Popen(command, env=child_env(), cwd=REPO,
                                                   stdin=subprocess.DEVNULL, stdout=stderr,
                                                   stderr=stderr))
            stderr.close()

    def wait(self, seconds: float) -> None:
        """Wait for every worker to finish its run (bounded), then check they exited cleanly."""
        for process in self.processes:
            process.wait(seconds + WORKER_GRACE_SECONDS)
        failed = [(index, process.returncode) for index, process in enumerate(self.processes)
                  if process.returncode != 0]
        if failed:
            errors = {index: (self.workdir / f"worker-{index}.err").read_text()[-3000:]
                      for index, _ in failed}
            raise AssertionError(f"workers failed: {failed}: {errors}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)

    def entries(self) -> list[dict]:
        return checker.read_logs(self.logs)

    def check(self, dsn: str, *, faults: bool = False) -> tuple[list[str], list[dict]]:
        from walqueue.pg import Client

        with Client(dsn, queue=self.queue, schema=self.schema, migrate=False, reaper=False) as client:
            tasks = {view.task_id: view for view in client.tasks()}
        entries = self.entries()
        return checker.check(entries, tasks, faults=faults), entries


def summary(entries: list[dict]) -> dict:
    """Counts of calls by op and outcome, for failure messages and sanity checks."""
    counts: dict[str, int] = {}
    for entry in entries:
        name = f"{entry['op']}:{entry['outcome']}"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
