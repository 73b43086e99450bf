"""No tool prints a DSN's password (SPEC §8b): walqueue-worker and walqueue-ctl, as real
processes, given DSNs with a password that cannot be reached or cannot be parsed. Their
stdout and stderr (the worker's log, psycopg's pool warnings, error messages, tracebacks)
never hold the password or a piece of it, and still say where they tried.
tests/pg/test_credentials.py does the same against a real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .daemon import REPO, child_env

SECRET = "s3cretPW9"
EXIT_SECONDS = 60.0  # the worker gives an unreachable PostgreSQL 10 s


def dsns(workdir):
    """(name, DSN, what the tools must show of it, exit code of the worker, of walqueue-ctl)."""
    nowhere = workdir / "no-such-dir"
    return [
        ("url", f"postgresql://worker:{SECRET}@/jobs?host={nowhere}",
         f"postgresql://worker:***@/jobs?host={nowhere}", 3, 3),
        ("url-query", f"postgres:///jobs?host={nowhere}&password={SECRET}",
         f"postgres:///jobs?host={nowhere}&password=***", 3, 3),
        ("url-percent", f"postgresql://worker:{SECRET}%20x@/jobs?host={nowhere}",
         f"postgresql://worker:***@/jobs?host={nowhere}", 3, 3),
        # A key=value DSN is PostgreSQL for every tool (SPEC §9's one rule, walqueue.backend).
        ("key-value", f"host={nowhere} user=worker password='{SECRET} x' dbname=jobs",
         f"host={nowhere} user=worker password=*** dbname=jobs", 3, 3),
        # libpq quotes pieces of a DSN it cannot parse: the password's, here.
        ("bad-percent", f"postgresql://worker:{SECRET}%zz@/jobs?host={nowhere}",
         f"postgresql://worker:***@/jobs?host={nowhere}", 2, 2),
        ("bad-utf8", f"postgresql://worker:{SECRET}%80@/jobs?host={nowhere}",
         f"postgresql://worker:***@/jobs?host={nowhere}", 2, 2),
        ("bad-spaces", f"postgresql://worker:{SECRET} x@/jobs?host={nowhere}",
         f"postgresql://worker:***@/jobs?host={nowhere}", 2, 2),
        ("bad-key-value", f"host={nowhere} password={SECRET} x",
         f"host={nowhere} password=***", 2, 2),
    ]


def run_all(commands: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """Run the commands side by side (the worker's waits are idle), each bounded; their exit
    codes and stdout plus stderr."""
    processes = {name: subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, env=child_env(), cwd=REPO, text=True)
                 for name, command in commands.items()}
    results = {}
    try:
        for name, process in processes.items():
            try:
                output, _ = process.communicate(timeout=EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate(timeout=EXIT_SECONDS)
                output += f"\n[still running after {EXIT_SECONDS} s: killed]"
            results[name] = (process.returncode, output)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(EXIT_SECONDS)
    return results


def problems_of(name: str, code: int, output: str, shown: str, expected_code: int) -> list[str]:
    """What is wrong with one run: the password printed, another exit code, the DSN not shown."""
    problems = []
    if any(piece in output for piece in (SECRET, "PW9")):
        problems.append("prints the password")
    if code != expected_code:
        problems.append(f"exits {code}, not {expected_code}")
    if shown not in output:
        problems.append(f"does not show {shown!r}")
    if "Traceback" in output:
        problems.append("prints a traceback")
    return [f"{name}: {problem}" for problem in problems]


def assert_no_problems(problems: list[str], results: dict[str, tuple[int, str]]) -> None:
    outputs = "\n".join(f"--- {name} (exit {code}) ---\n{output}" for name, (code, output) in results.items())
    assert not problems, "\n".join(problems) + "\n" + outputs


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("credentials")
    cases = dsns(workdir)
    commands = {name: [sys.executable, "-m", "walqueue.worker.cli", dsn, "tests.process.worker_handlers:record",
                       "--max-tasks", "1"] for name, dsn, *_ in cases}
    return cases, run_all(commands)


def test_walqueue_worker_never_prints_the_password(worker_results):
    cases, results = worker_results
    problems = [problem for name, _, shown, worker_code, _ in cases
                for problem in problems_of(name, *results[name], shown, worker_code)]
    assert_no_problems(problems, results)


@pytest.mark.parametrize("command", [["stats"], ["migrate"], ["put", "t1", "{}"]])
def test_walqueue_ctl_never_prints_the_password(tmp_path, command):
    cases = dsns(tmp_path)
    results = run_all({name: [sys.executable, "-m", "walqueue.ctl", "--timeout", "1", "--dsn", dsn, *command]
                       for name, dsn, *_ in cases})
    problems = [problem for name, _, shown, _, ctl_code in cases
                for problem in problems_of(name, *results[name], shown, ctl_code)]
    assert_no_problems(problems, results)


def test_walqueue_ctl_never_prints_the_password_from_the_environment(tmp_path):
    dsn = f"postgresql://worker:{SECRET}@/jobs?host={tmp_path}/no-such-dir"
    env = child_env({"WALQUEUE_DSN": dsn})
    result = subprocess.run([sys.executable, "-m", "walqueue.ctl", "--timeout", "1", "stats"], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=EXIT_SECONDS)
    output = result.stdout + result.stderr
    shown = f"postgresql://worker:***@/jobs?host={tmp_path}/no-such-dir"
    assert_no_problems(problems_of("WALQUEUE_DSN", result.returncode, output, shown, 3),
                       {"WALQUEUE_DSN": (result.returncode, output)})
