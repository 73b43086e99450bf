"""The examples in README.md and docs/ run as they stand.

A fenced code block whose info string holds the word `run` is an example:
```` ```python run ```` runs in a fresh interpreter, ```` ```sh run ```` in
`bash -euo pipefail`, and `daemon=DIR` starts walqueued on DIR (socket
DIR/walqueued.sock, as `scripts/serve DIR` would) for the example and stops
it after. A block marked `output` right after an example is what that
example must print, byte for byte.

All examples share one working directory (with `.venv` linked to this
environment, as in a checkout) and run in document order, README first, as
a reader trying them one after another in one checkout would: two examples
that used one directory for different tasks would meet each other's tasks
here too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .daemon import REPO, Daemon, child_env

EXAMPLE_SECONDS = 120.0
FENCE = re.compile(r"^(\s*)```(.*)$")
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Documents whose every Python block must be an example.
ALL_PYTHON_RUNS = (REPO / "README.md", REPO / "docs" / "daemon.md")


@dataclass
class Block:
    document: Path
    line: int
    language: str
    words: list[str]
    code: str
    expected_output: str | None = None

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(REPO)}:{self.line}"

    @property
    def daemon_directory(self) -> str | None:
        found = [word.split("=", 1)[1] for word in self.words if word.startswith("daemon=")]
        return found[0] if found else None


def blocks(document: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with its info string's words."""
    found: list[Block] = []
    lines = document.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, info = match.groups()
        start = index + 1
        index = start
        while index < len(lines) and lines[index].strip() != "```":
            index += 1
        body = "\n".join(line.removeprefix(indent) for line in lines[start:index]) + "\n"
        words = info.split()
        found.append(Block(document, start, words[0] if words else "", words[1:], body))
        index += 1
    for previous, block in zip(found, found[1:], strict=False):
        if "output" in block.words and "run" in previous.words:
            previous.expected_output = block.code
    return found


EXAMPLES = [block for document in DOCUMENTS for block in blocks(document) if "run" in block.words]


@pytest.fixture(scope="module")
def checkout():
    """A working directory standing for the reader's checkout."""
    path = Path(tempfile.mkdtemp(prefix="wq-docs-", dir="/tmp"))
    (path / ".venv").symlink_to(sys.prefix)
    (path / "daemons").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_documents_hold_examples_and_mark_every_python_one_in_readme_and_daemon_md():
    assert len(EXAMPLES) >= 7
    for document in ALL_PYTHON_RUNS:
        unmarked = [block.name for block in blocks(document)
                    if block.language == "python" and "run" not in block.words]
        assert not unmarked, f"Python blocks not run as examples: {unmarked}"
    assert all(block.language in ("python", "sh") for block in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=[block.name for block in EXAMPLES])
def test_the_example_runs_as_documented(example: Block, checkout: Path):
    daemon = None
    if example.daemon_directory is not None:
        directory = checkout / example.daemon_directory
        daemon = Daemon(checkout / "daemons", directory, str(directory / "walqueued.sock"))
        directory.mkdir(parents=True, exist_ok=True)
    env = child_env()
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    command = ([sys.executable, "-c", example.code] if example.language == "python"
               else ["bash", "-euo", "pipefail", "-c", example.code])
    try:
        if daemon is not None:
            daemon.start()
        result = subprocess.run(command, capture_output=True, text=True, cwd=checkout, env=env,
                                timeout=EXAMPLE_SECONDS)
    finally:
        if daemon is not None:
            daemon.cleanup()
    assert result.returncode == 0, f"{example.name} failed:\n{result.stdout}\n{result.stderr}" + (
        f"\ndaemon log:\n{daemon.log()}" if daemon else "")
    if example.expected_output is not None:
        assert result.stdout == example.expected_output


def test_the_readme_worker_example_run_twice_ends_and_sends_once(workdir):
    """Issue 23: the README worker example waited for ever on its second run (the put is a
    no-op, the task already completed). It ends now, and its first run logs its task."""
    (example,) = [block for block in EXAMPLES if block.document.name == "README.md"
                  and 'Worker(client, "mailer-1"' in block.code]
    directory = workdir / example.daemon_directory
    directory.mkdir(parents=True)
    (workdir / "daemons").mkdir()
    daemon = Daemon(workdir / "daemons", directory, str(directory / "walqueued.sock"))
    runs = []
    try:
        daemon.start()
        for _ in range(2):
            runs.append(subprocess.run([sys.executable, "-c", example.code], capture_output=True,
                                       text=True, cwd=workdir, env=child_env(),
                                       timeout=EXAMPLE_SECONDS))
    finally:
        daemon.cleanup()
    first, second = runs
    assert (first.returncode, first.stdout) == (0, "sending to ada@example.com\n"), first.stderr
    assert "task email-1 generation 1 attempt 1: done in" in first.stderr  # logged by default
    assert (second.returncode, second.stdout) == (0, ""), second.stderr
