"""Seeded real-kill harness: walqueued SIGKILLed under live workers, restarted, drained, checked.

``run_seed(seed)`` draws everything from ``random.Random(seed)``
(``schedule_for``): the number of worker processes, the daemon's
``--compact-wal-bytes`` and ``--compact-wal-ratio``, and a list of daemon
*incarnations*, each of which dies by SIGKILL:

* armed: walqueued runs with ``--test-hook tests.process.kill_hook:hook``,
  which kills it at the n-th occurrence of a named phase (SPEC §6);
* a tear: armed at ``wal.before_write``, the hook first appends part of a
  frame to the newest segment, then dies — a kill in the middle of a write.
  The next incarnation is armed at ``recover.after_truncate`` (n=1), so it
  dies during the recovery that truncates that torn tail. The torn
  incarnation runs with ``--preallocate-wal-bytes 0``: a torn append is a
  torn tail, while a write torn inside a preallocated segment is the
  CorruptStore case docs/failure-model.md describes, which no restart can
  survive. Every other incarnation preallocates (``--preallocate-wal-bytes``
  4 MiB; the daemon's default is to append), so the directory changes hands
  between appending and preallocating daemons;
* while a snapshot child writes (``child.writing``, a kill point of the
  harness, not a phase of SPEC §6): the daemon compacts in a forked child,
  and kill_hook's ``child_hook`` in the n-th child SIGKILLs the daemon, then
  lingers as a long write would. The phases a background compaction passes
  through in the daemon (wal.after_rotate before the fork; snapshot.after_write,
  current.after_write, current.after_publish, compact.after_delete after the
  child exited) are the hook's, as before;
* timed: unarmed, and the harness sends SIGKILL a seeded time after READY
  (a snapshot child may be writing then: those kills are counted apart).

After every kill the harness checks that each snapshot child the daemon had
(the kill hook lists them from /proc before it kills; the harness reads them
before a timed kill) is gone within ``CHILD_EXIT_SECONDS`` — a child must
die with its parent — and the next incarnation must find the directory
unlocked (an orphan holding the LOCK would make it exit 3).

Like a supervisor, the harness starts the next incarnation on the same
directory as soon as one dies. The workers (tests/process/crash_worker.py,
separate processes) run throughout, reconnect and go on. After the last kill
one unarmed incarnation serves a little longer; then the workers are told to
stop, the harness drains the queue (reserve + ack until nothing is ready or
leased, bounded, and logged like a worker), stops the daemon with SIGTERM
(it must exit 0), and ``tests.process.checker`` judges the directory and the
logs. Throughout, a thread reads the WAL segments every
``WAL_SAMPLE_SECONDS`` (and once after every kill, while nothing writes):
the daemons compact every few KiB, and the checker's claim 15 (each
worker's frames follow its log) can judge only records read before a
compaction deleted them; they are kept in ``wal-seen.records``.

Bounds: every wait has a deadline; every child is waited for; whatever is
still running when ``run_seed`` leaves — by success, a failure or an
exception — is SIGKILLed by pid and reaped. An armed incarnation whose phase
never comes within ``FALLBACK_SECONDS`` is SIGKILLed by the harness and
counted as ``fallback`` (not as that phase).

A failure names the seed and the schedule; ``python scripts/crash_proof.py
--seeds 1 --start SEED`` replays it (the schedule is the same; the exact
interleaving of the processes is the operating system's).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from walqueue import PHASES, CorruptStore

from . import checker, kill_hook
from .crash_worker import CrashWorker

REPO = Path(__file__).resolve().parents[2]
HOOK = "tests.process.kill_hook:hook"
BROKEN_HOOK = "tests.process.broken_hook:hook"  # the same hook in a daemon running a tests/broken.py variant
CHILD_HOOK = "tests.process.kill_hook:child_hook"
READY_SECONDS = 20.0
FALLBACK_SECONDS = 8.0
PREALLOCATE_WAL_BYTES = 4 * 1024 * 1024  # untorn incarnations preallocate, torn ones append
FINAL_MIN_SECONDS = 0.3
WORKER_EXIT_SECONDS = 45.0
WORKER_MAX_SECONDS = 600.0
DRAIN_SECONDS = 40.0
STOP_SECONDS = 15.0
REAP_SECONDS = 10.0
WAL_SAMPLE_SECONDS = 0.02
# A snapshot child may outlive its killed parent by this much, no more: SIGKILL
# waits for a write or fsync in progress, which a busy shared disk can stretch.
CHILD_EXIT_SECONDS = 5.0

TIMER = "timer"
FALLBACK = "fallback"
CHILD_WRITING = kill_hook.CHILD_WRITING  # the daemon killed by its snapshot child, while it writes
TIMER_WITH_CHILD = "timer with a snapshot child"
COMPACTION_PHASES = ("wal.after_rotate", "snapshot.after_write", "current.after_write",
                     "current.after_publish", "compact.after_delete")
KILL_MODES = (*PHASES, CHILD_WRITING, TIMER)
MAX_TORN_BYTES = 235  # below 4 + 200 + 32: kill_hook's torn frame is always incomplete


@dataclass(frozen=True)
class Incarnation:
    """One daemon run that is meant to die: armed at (phase, at), or killed ``timer`` s after READY."""

    phase: str | None = None
    at: int = 1
    tear_bytes: int = 0
    timer: float | None = None

    def describe(self) -> str:
        if self.phase is None:
            return f"timer@{self.timer:.2f}s"
        tear = f"+tear{self.tear_bytes}B" if self.tear_bytes else ""
        return f"{self.phase}#{self.at}{tear}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    workers: int
    compact_wal_bytes: int
    compact_wal_ratio: float
    incarnations: tuple[Incarnation, ...]
    final_seconds: float

    def describe(self) -> str:
        kills = ", ".join(incarnation.describe() for incarnation in self.incarnations)
        return (f"seed={self.seed} workers={self.workers} compact_wal_bytes={self.compact_wal_bytes} "
                f"compact_wal_ratio={self.compact_wal_ratio:g} kills=[{kills}] final={self.final_seconds:.2f}s")


def schedule_for(seed: int) -> Schedule:
    """Everything a run decides up front, from the seed alone."""
    rng = random.Random(seed)
    workers = rng.randint(2, 4)
    compact_wal_bytes = rng.choice([2048, 4096, 16384, 65536])
    compact_wal_ratio = rng.choice([0.0, 0.5, 1.0])
    incarnations: list[Incarnation] = []
    for _ in range(rng.randint(2, 4)):
        mode = rng.choice(KILL_MODES)
        if mode == TIMER:
            incarnations.append(Incarnation(timer=round(rng.uniform(0.05, 1.5), 3)))
        elif mode == "recover.after_truncate":
            incarnations.append(Incarnation("wal.before_write", at=rng.randint(1, 30),
                                            tear_bytes=rng.randint(1, MAX_TORN_BYTES)))
            incarnations.append(Incarnation("recover.after_truncate", at=1))
        elif mode in COMPACTION_PHASES or mode == CHILD_WRITING:
            incarnations.append(Incarnation(mode, at=rng.randint(1, 2)))
        else:
            incarnations.append(Incarnation(mode, at=rng.randint(1, 40)))
    return Schedule(seed, workers, compact_wal_bytes, compact_wal_ratio, tuple(incarnations),
                    round(rng.uniform(FINAL_MIN_SECONDS, 1.0), 3))


@dataclass
class SeedResult:
    seed: int
    schedule: Schedule
    kills: list[str] = field(default_factory=list)  # a phase, CHILD_WRITING, TIMER(_WITH_CHILD) or FALLBACK
    operations: int = 0
    outcomes: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)  # the checker's, and the harness's own failures
    tasks: int = 0
    in_doubt: Counter = field(default_factory=Counter)  # checker.in_doubt: unanswered acks, on disk or not
    seconds: float = 0.0
    workdir: str = ""
    daemon_logs: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        """Everything needed to understand and replay a failure."""
        lines = [f"seed {self.seed} FAILED: {len(self.violations)} violation(s)",
                 f"replay: python scripts/crash_proof.py --seeds 1 --start {self.seed}",
                 f"schedule: {self.schedule.describe()}",
                 f"kills as they happened: {self.kills}",
                 f"directory and logs kept in: {self.workdir}",
                 *(f"  {violation}" for violation in self.violations),
                 "daemon logs (tails):", self.daemon_logs]
        return "\n".join(lines)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "WALQUEUE_BROKEN",
                 "WALQUEUE_KILL_PHASE", "WALQUEUE_KILL_AT", "WALQUEUE_KILL_TEAR_DIRECTORY",
                 "WALQUEUE_KILL_TEAR_BYTES"):
        env.pop(name, None)
    env.update(extra)
    return env


class HarnessFailure(Exception):
    """Something the harness expected did not happen (a daemon exited on its own, a worker hung, ...)."""


class DaemonRun:
    """One walqueued incarnation: a child process with its own log and sd_notify socket."""

    def __init__(self, workdir: Path, number: int, directory: Path, socket_path: Path,
                 compact_wal_bytes: int, env: dict[str, str], broken: str | None = None,
                 preallocate_wal_bytes: int | None = None, compact_wal_ratio: float = 1.0) -> None:
        self.log_path = workdir / f"daemon-{number}.log"
        self.notify_path = workdir / f"n{number}.sock"
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._notify.bind(str(self.notify_path))
        command = [sys.executable, "-m", "walqueue.daemon.cli", "serve", str(directory),
                   "--socket", str(socket_path), "--compact-wal-bytes", str(compact_wal_bytes),
                   "--compact-wal-ratio", str(compact_wal_ratio), "--log-level", "info",
                   "--test-hook", BROKEN_HOOK if broken else HOOK, "--test-child-hook", CHILD_HOOK]
        if preallocate_wal_bytes is not None:
            command += ["--preallocate-wal-bytes", str(preallocate_wal_bytes)]
        if broken:
            env = {**env, "WALQUEUE_BROKEN": broken}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=child_env({"NOTIFY_SOCKET": str(self.notify_path), **env}),
                                         cwd=REPO)

    def wait_ready(self, timeout: float) -> bool:
        """True at READY=1; False if the process exited first. Raises HarnessFailure on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessFailure(f"walqueued (pid {self.proc.pid}) not ready after {timeout} s")
            self._notify.settimeout(min(remaining, 0.1))  # also re-checks that the process lives
            try:
                message = self._notify.recv(4096).decode()
            except TimeoutError:
                continue
            if "READY=1" in message.split("\n"):
                return True

    def sigkill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(REAP_SECONDS)

    def children(self) -> list[int]:
        """The daemon's child processes now (its snapshot children), from /proc."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as file:
                return [int(pid) for pid in file.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            return []

    def close(self) -> None:
        if self.proc.poll() is None:
            self.sigkill()
        self._notify.close()

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(f"    {self.log_path.name}: {line}" for line in text[-lines:])


class Run:
    """The mutable state of one seed's run; ``run_seed`` is its only user."""

    def __init__(self, schedule: Schedule, workdir: Path, broken: str | None = None) -> None:
        self.schedule = schedule
        self.broken = broken
        self.workdir = workdir
        self.directory = workdir / "queue"
        self.socket_path = workdir / "wq.sock"
        self.kill_log = workdir / "kills.jsonl"
        self.stop_file = workdir / "stop"
        self.daemons: list[DaemonRun] = []
        self.workers: list[subprocess.Popen] = []
        self.worker_logs: list[Path] = []
        self.kills: list[str] = []
        self.children: set[int] = set()  # snapshot children seen: killed by pid at cleanup if alive
        self.wal_history = checker.WalHistory()  # every WAL record the harness managed to read
        self._wal_lock = threading.Lock()
        self._sampling = threading.Event()
        self._kill_lines_seen = 0

    def start_daemon(self, incarnation: Incarnation | None) -> DaemonRun:
        env = {"WALQUEUE_KILL_LOG": str(self.kill_log)}
        preallocate = PREALLOCATE_WAL_BYTES
        if incarnation is not None and incarnation.phase is not None:
            env["WALQUEUE_KILL_PHASE"] = incarnation.phase
            env["WALQUEUE_KILL_AT"] = str(incarnation.at)
            if incarnation.tear_bytes:
                env["WALQUEUE_KILL_TEAR_DIRECTORY"] = str(self.directory)
                env["WALQUEUE_KILL_TEAR_BYTES"] = str(incarnation.tear_bytes)
                preallocate = 0  # the hook's tear is an append cut short (see the module header)
        daemon = DaemonRun(self.workdir, len(self.daemons) + 1, self.directory, self.socket_path,
                           self.schedule.compact_wal_bytes, env, self.broken, preallocate,
                           self.schedule.compact_wal_ratio)
        self.daemons.append(daemon)
        return daemon

    def start_workers(self) -> None:
        for number in range(self.schedule.workers):
            name = f"w{number}"
            log_path = self.workdir / f"{name}.jsonl"
            self.worker_logs.append(log_path)
            stderr = open(self.workdir / f"{name}.err", "ab")  # noqa: SIM115 - closed right after Popen
            with stderr:
                self.workers.append(subprocess.Popen(
                    [sys.executable, "-m", "tests.process.crash_worker", str(self.socket_path), str(log_path),
                     name, str(self.schedule.seed), str(self.stop_file), str(WORKER_MAX_SECONDS)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                    env=child_env({}), cwd=REPO))

    def read_wal(self) -> None:
        records = checker.read_wal(self.directory)
        with self._wal_lock:
            self.wal_history.add(records)

    def sample_wal(self) -> None:
        """Read the WAL every WAL_SAMPLE_SECONDS until told to stop (a thread of this process).

        The daemons compact every few KiB, so the checker's claim 15 can judge
        only what was read before a compaction deleted it.
        """
        while not self._sampling.wait(WAL_SAMPLE_SECONDS):
            self.read_wal()

    def new_kill_lines(self) -> list[dict]:
        try:
            lines = self.kill_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        fresh = lines[self._kill_lines_seen:]
        self._kill_lines_seen = len(lines)
        return [json.loads(line) for line in fresh]

    def unexpected_exit(self, daemon: DaemonRun, what: str) -> HarnessFailure:
        reason = next((line.strip() for line in daemon.log_tail(400).splitlines()
                       if " ERROR " in line or " CRITICAL " in line), "no error in its log")
        return HarnessFailure(f"walqueued {what} exited with code {daemon.proc.returncode} "
                              f"(4 = it found the directory corrupt): {reason}")

    def expect_sigkilled(self, daemon: DaemonRun, what: str) -> None:
        if daemon.proc.returncode != -signal.SIGKILL:
            raise self.unexpected_exit(daemon, f"{what}, instead of dying by SIGKILL,")

    def kill_one(self, incarnation: Incarnation) -> None:
        """Run one incarnation until it dies; record how."""
        daemon = self.start_daemon(incarnation)
        if incarnation.phase is None:
            if not daemon.wait_ready(READY_SECONDS):
                raise self.unexpected_exit(daemon, "before READY")
            try:
                daemon.proc.wait(incarnation.timer)
            except subprocess.TimeoutExpired:
                children = daemon.children()
                daemon.sigkill()
                self.kills.append(TIMER_WITH_CHILD if children else TIMER)
                self.expect_children_gone(children, "a timed kill")
                return
            raise self.unexpected_exit(daemon, "on its own")
        try:
            daemon.proc.wait(FALLBACK_SECONDS)
        except subprocess.TimeoutExpired:
            daemon.sigkill()
            self.kills.append(FALLBACK)
            return
        self.expect_sigkilled(daemon, f"armed at {incarnation.describe()}")
        lines = self.new_kill_lines()
        if len(lines) != 1 or lines[0]["phase"] != incarnation.phase or lines[0]["pid"] != daemon.proc.pid \
                or (lines[0]["torn_bytes"] > 0) != (incarnation.tear_bytes > 0):
            raise HarnessFailure(f"walqueued armed at {incarnation.describe()} died by SIGKILL but the kill "
                                 f"log says {lines}")
        self.kills.append(incarnation.phase)
        children = lines[0].get("children", []) + ([lines[0]["child_pid"]] if "child_pid" in lines[0] else [])
        self.expect_children_gone(children, f"the kill at {incarnation.describe()}")

    def expect_children_gone(self, children: list[int], what: str) -> None:
        """Each snapshot child of a killed daemon must be gone within CHILD_EXIT_SECONDS."""
        self.children.update(children)
        deadline = time.monotonic() + CHILD_EXIT_SECONDS
        for pid in children:
            if not process_exits(pid, max(0.0, deadline - time.monotonic())):
                raise HarnessFailure(f"snapshot child pid {pid} outlived its daemon by more than "
                                     f"{CHILD_EXIT_SECONDS} s after {what}")

    def run(self) -> bool:
        """Kills, final serve, drain, stop. Returns whether the drain emptied the queue."""
        # The workers start first and wait for the daemon on their own.
        self.start_workers()
        sampler = threading.Thread(target=self.sample_wal, name="wal-sampler", daemon=True)
        sampler.start()
        try:
            return self._run()
        finally:
            self._sampling.set()
            sampler.join(REAP_SECONDS)

    def _run(self) -> bool:
        for incarnation in self.schedule.incarnations:
            if incarnation.phase == "recover.after_truncate" and self.kills[-1:] != ["wal.before_write"]:
                # The tear before it never happened (its phase did not come in time):
                # there is no torn tail, so this phase cannot come either.
                incarnation = Incarnation(timer=0.0)
            self.kill_one(incarnation)
            # Dead, so nothing writes: the records the next incarnation recovers from,
            # ending with the frames of the requests the kill left unanswered.
            self.read_wal()
        final = self.start_daemon(None)
        if not final.wait_ready(READY_SECONDS):
            raise self.unexpected_exit(final, "(the final one) before READY")
        try:
            final.proc.wait(self.schedule.final_seconds)
            raise self.unexpected_exit(final, "(the final one) on its own")
        except subprocess.TimeoutExpired:
            pass
        self.stop_file.touch()
        for worker in self.workers:
            try:
                code = worker.wait(WORKER_EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                raise HarnessFailure(f"worker pid {worker.pid} did not stop within {WORKER_EXIT_SECONDS} s") \
                    from None
            if code != 0:
                raise HarnessFailure(f"worker pid {worker.pid} exited with code {code}: {self.worker_errors()}")
        drain_log = self.workdir / "drain.jsonl"
        self.worker_logs.append(drain_log)
        drainer = CrashWorker(str(self.socket_path), str(drain_log), "drain", self.schedule.seed, None)
        try:
            drained = drainer.drain(DRAIN_SECONDS)
        finally:
            drainer.close()
        final.proc.send_signal(signal.SIGTERM)
        try:
            code = final.proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            raise HarnessFailure(f"walqueued ignored SIGTERM for {STOP_SECONDS} s") from None
        if code != 0:
            raise HarnessFailure(f"walqueued exited with code {code} after SIGTERM")
        if not drained:
            raise HarnessFailure(f"the drain did not empty the queue within {DRAIN_SECONDS} s")
        return drained

    def worker_errors(self) -> str:
        tails = []
        for path in sorted(self.workdir.glob("w*.err")):
            text = path.read_text(errors="replace").strip()
            if text:
                tails.append(f"{path.name}: {text[-2000:]}")
        return "\n".join(tails) or "(no stderr)"

    def cleanup(self) -> None:
        """SIGKILL and reap, by pid, every child still running (and any snapshot child left over)."""
        for pid in self.children:
            if not process_exits(pid, 0.0) and is_daemon_of(pid, self.directory):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
            try:
                worker.wait(REAP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        for daemon in self.daemons:
            try:
                daemon.close()
            except subprocess.TimeoutExpired:
                pass


def process_exits(pid: int, timeout: float) -> bool:
    """True if process ``pid`` (not a child of ours) is gone, or exits within ``timeout``."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(pidfd)


def is_daemon_of(pid: int, directory: Path) -> bool:
    """True if ``pid`` runs walqueued on ``directory`` (a snapshot child is a fork of it): never
    signal a process the pid was reused for."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            arguments = file.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return b"walqueue.daemon.cli" in arguments and str(directory).encode() in arguments


def count_operations(log_paths: list[Path]) -> tuple[int, Counter]:
    outcomes: Counter = Counter()
    for record in checker.read_logs([path for path in log_paths if path.exists()]):
        outcomes[record["outcome"]] += 1
    return sum(outcomes.values()), outcomes


def run_seed(seed: int, *, keep: bool = False, broken: str | None = None) -> SeedResult:
    """Run one seed end to end; never leaves a process running. The workdir is kept on failure.

    ``broken`` names a variant of tests/broken.py, or a daemon variant of
    tests/process/broken_hook.py, for the daemons to run (default:
    $WALQUEUE_BROKEN, as for the rest of the suite); the checker
    reads the directory with this process's library.
    """
    if broken is None:
        broken = os.environ.get("WALQUEUE_BROKEN") or None
    schedule = schedule_for(seed)
    result = SeedResult(seed, schedule)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"wqc{seed}-", dir="/tmp"))  # short: socket paths
    result.workdir = str(workdir)
    run = Run(schedule, workdir, broken)
    drained = False
    try:
        try:
            drained = run.run()
        except HarnessFailure as exc:
            result.violations.append(f"harness: {exc}")
        finally:
            run.cleanup()
        result.kills = list(run.kills)
        if not any(kill != FALLBACK for kill in run.kills):
            result.violations.append("harness: the daemon was never killed by a hook or a timer")
        with open(workdir / "wal-seen.records", "w") as seen:  # the evidence for claim 15, kept with the logs
            seen.writelines(json.dumps(run.wal_history.records[seq], sort_keys=True) + "\n"
                            for seq in sorted(run.wal_history.records))
        existing_logs = [path for path in run.worker_logs if path.exists()]
        result.operations, result.outcomes = count_operations(existing_logs)
        if not result.violations:
            result.violations.extend(checker.check(run.directory, existing_logs, drained=drained,
                                                   wal_history=run.wal_history))
            tasks = checker.read_directory(run.directory)
            result.tasks = len(tasks)
            result.in_doubt = checker.in_doubt(checker.read_logs(existing_logs), tasks)
            if not tasks:
                result.violations.append("harness: no task reached the directory (a vacuous run)")
    except CorruptStore as exc:  # the checker could not open what the daemons left behind
        result.violations.append(f"corrupt directory: {exc}")
    except Exception as exc:  # a crash of the harness or the checker is a failed seed, with its report
        result.violations.append(f"harness: {type(exc).__name__}: {exc}")
    finally:
        run.cleanup()
        result.seconds = time.monotonic() - started
        result.daemon_logs = "\n".join(daemon.log_tail() for daemon in run.daemons)
        if result.ok and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


@dataclass
class Summary:
    seeds: int = 0
    kills: int = 0
    kills_by_phase: Counter = field(default_factory=Counter)
    operations: int = 0
    outcomes: Counter = field(default_factory=Counter)
    in_doubt: Counter = field(default_factory=Counter)
    violations: int = 0
    failed_seeds: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.kills += sum(1 for kill in result.kills if kill != FALLBACK)
        self.kills_by_phase.update(result.kills)
        self.operations += result.operations
        self.outcomes.update(result.outcomes)
        self.in_doubt.update(result.in_doubt)
        self.violations += len(result.violations)
        if result.violations:
            self.failed_seeds.append(result.seed)

    def phases_hit(self) -> set[str]:
        return {phase for phase in PHASES if self.kills_by_phase[phase]}

    def line(self) -> str:
        by_phase = {phase: self.kills_by_phase[phase]
                    for phase in (*PHASES, CHILD_WRITING, TIMER, TIMER_WITH_CHILD, FALLBACK)}
        outcomes = {name: self.outcomes[name] for name in ("ok", "error", "unknown")}
        return (f"[crash proof] seeds={self.seeds} kills={self.kills} kills_by_phase={by_phase} "
                f"operations={self.operations} outcomes={outcomes} "
                f"unanswered={dict(sorted(self.in_doubt.items()))} violations={self.violations} "
                f"phases_hit={len(self.phases_hit())}/{len(PHASES)}")

