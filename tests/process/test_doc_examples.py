"""The examples in README.md and docs/ run as they stand.

A fenced code block whose info string holds the word `run` is an example:
```` ```python run ```` runs in a fresh interpreter, ```` ```sh run ```` in
`bash -euo pipefail`, and `daemon=DIR` starts walqueued on DIR (socket
DIR/walqueued.sock, as `scripts/serve DIR` would) for the example and stops
it after. A block marked `output` right after an example is what that
example must print, byte for byte.

All examples share one working directory (with `.venv` linked to this
environment, as in a checkout, and HOME a directory in it) and run in
document order, README first, as a reader trying them one after another in
one checkout would: two examples that used one directory for different tasks
would meet each other's tasks here too. An example with `daemon=DIR` runs
with WALQUEUE_SOCKET set to that daemon's socket, as a reader who exported
it would. Examples marked `pg` need PostgreSQL and run in tests/pg
(test_doc_examples_pg.py).

The documents a new user walks first (README.md, docs/operations.md,
docs/postgres.md) hold no unmarked command: each `sh` or `python` block in
them is an example, or says why it cannot run here with `not-run=REASON`,
and each REASON is checked against the block (REASONS below): a `server`
block must act on a server (units, /etc, /opt, ...), and its walqueue-ctl
commands must parse as walqueue-ctl would parse them, its units exist in
systemd/ and its scripts/install options be scripts/install's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from walqueue.ctl import cli as ctl_cli
from walqueue.daemon import cli as daemon_cli
from walqueue.schedule import cli as schedule_cli
from walqueue.web import cli as web_cli
from walqueue.worker import cli as worker_cli

from .daemon import REPO, Daemon, child_env

EXAMPLE_SECONDS = 120.0
FENCE = re.compile(r"^(\s*)```(.*)$")
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Documents whose every Python block must be an example.
ALL_PYTHON_RUNS = (REPO / "README.md", REPO / "docs" / "daemon.md")
# Documents whose every sh and python block is an example or says why not (not-run=REASON).
WALKED = (REPO / "README.md", REPO / "docs" / "operations.md", REPO / "docs" / "postgres.md",
          REPO / "docs" / "web.md")
COMMAND_LANGUAGES = ("sh", "python")


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

    @property
    def not_run_reason(self) -> str | None:
        found = [word.split("=", 1)[1] for word in self.words if word.startswith("not-run=")]
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


EXAMPLES = [block for document in DOCUMENTS for block in blocks(document)
            if "run" in block.words and "pg" not in block.words]


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block, each as its words (comments, redirections and
    the variable assignments before a command left out; pipelines and lists split)."""
    found = []
    for line in code.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError:  # a quote spanning lines: a here-document or a long string
            continue
        current: list[str] = []
        skip_next = False
        for word in [*words, ";"]:
            if skip_next:
                skip_next = False
            elif word in (";", "&&", "||", "|", "&", "if", "then", "fi", "!", "$("):
                if current:
                    found.append(current)
                current = []
            elif word in ("<", ">", ">>", "2>", "2>>") or word.endswith(">"):
                skip_next = True
            elif not current and re.fullmatch(r"\w+=\S*", word):
                continue
            else:
                current.append(word)
    return found


def parse_as_walqueue_ctl(args: list[str]) -> None:
    """Parse ARGS as walqueue-ctl would, without running the command (click.UsageError if wrong)."""
    context = ctl_cli.make_context("walqueue-ctl", list(args))
    protected = context._protected_args if hasattr(context, "_protected_args") else context.protected_args
    rest = [*protected, *context.args]
    name, command, rest = ctl_cli.resolve_command(context, rest)
    command.make_context(name, rest, parent=context)


SERVER_SIGNS = re.compile(r"\b(systemctl|journalctl|systemd-sysusers|systemd-tmpfiles)\b|scripts/install"
                          r"|(^|\s)(/etc|/opt|/var/lib|/run|/var/backups)/", re.MULTILINE)


def check_server_block(block: Block) -> None:
    """It acts on a server: its units, /etc, /opt, /var/lib or /run. What can be checked here is."""
    assert SERVER_SIGNS.search(block.code), f"{block.name} names nothing of a server"
    units = {path.name for path in (REPO / "systemd").iterdir()}
    install_help = subprocess.run([str(REPO / "scripts" / "install"), "--help"], capture_output=True,
                                  text=True, timeout=EXAMPLE_SECONDS).stdout
    for words in commands(block.code):
        program, args = Path(words[0]).name, words[1:]
        if program == "walqueue-ctl":
            try:
                parse_as_walqueue_ctl(args)
            except click.ClickException as exc:
                raise AssertionError(f"{block.name}: walqueue-ctl {' '.join(args)}: {exc}") from None
        elif program in ("systemctl", "journalctl"):
            for word in args:
                unit = re.fullmatch(r"'?([\w-]+)(@[\w*-]*)?(\.service|\.socket)?'?", word)
                if word.startswith("-") or unit is None or not unit.group(1).startswith("walqueue"):
                    continue
                template = unit.group(1) + ("@" if unit.group(2) else "")
                assert any(name.startswith(template + ".") for name in units), f"{block.name}: {word}"
        elif words[0] == "scripts/install":
            for word in args:
                if word.startswith("--"):
                    assert word in install_help, f"{block.name}: scripts/install {word}"


def check_scripts_block(block: Block) -> None:
    """scripts/serve runs until Ctrl-C, scripts/test runs this suite: test_scripts.py runs both."""
    runs = (REPO / "tests" / "process" / "test_scripts.py").read_text()
    for words in commands(block.code):
        assert words[0] in ("scripts/serve", "scripts/test"), f"{block.name}: {words}"
        assert f'"scripts" / "{words[0].split("/")[1]}"' in runs, f"test_scripts.py does not run {words[0]}"


def check_serving_block(block: Block) -> None:
    """walqueue-web serves until stopped (and pip would install into this suite's own venv):
    each walqueue-web command must parse as walqueue-web parses it, and a test must start one."""
    starts = (REPO / "tests" / "process" / "test_web_process.py").read_text()
    assert '"walqueue.web.cli"' in starts, "no test starts walqueue-web"
    served = 0
    for words in commands(block.code):
        program = Path(words[0]).name
        if program == "pip":
            assert words[1] == "install", f"{block.name}: {words}"
            continue
        assert program == "walqueue-web", f"{block.name}: {words}"
        try:
            web_cli.main.make_context("walqueue-web", words[1:])
        except click.ClickException as exc:
            raise AssertionError(f"{block.name}: {' '.join(words)}: {exc}") from None
        served += 1
    assert served, f"{block.name} starts no walqueue-web"


# Why a block of a walked document cannot run here, and how that is checked.
REASONS = {
    "server": check_server_block,
    "scripts": check_scripts_block,
    "serves": check_serving_block,
}


@pytest.fixture(scope="module")
def checkout():
    """A working directory standing for the reader's checkout."""
    path = Path(tempfile.mkdtemp(prefix="wq-docs-", dir="/tmp"))
    (path / ".venv").symlink_to(sys.prefix)
    (path / "daemons").mkdir()
    (path / "home").mkdir()
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
    env["HOME"] = str(checkout / "home")
    if daemon is not None:
        env["WALQUEUE_SOCKET"] = str(checkout / example.daemon_directory / "walqueued.sock")
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


WALKED_BLOCKS = [block for document in WALKED for block in blocks(document)
                 if block.language in COMMAND_LANGUAGES]


def test_every_command_block_of_the_walked_documents_runs_or_says_why_not():
    assert len(WALKED_BLOCKS) >= 15
    unmarked = [block.name for block in WALKED_BLOCKS
                if "run" not in block.words and block.not_run_reason is None]
    assert not unmarked, f"blocks neither run nor marked not-run=REASON: {unmarked}"
    unknown = [block.name for block in WALKED_BLOCKS
               if block.not_run_reason is not None and block.not_run_reason not in REASONS]
    assert not unknown, f"not-run=REASON with a REASON not in {sorted(REASONS)}: {unknown}"


NOT_RUN = [block for block in WALKED_BLOCKS if block.not_run_reason is not None]


@pytest.mark.parametrize("block", NOT_RUN, ids=[block.name for block in NOT_RUN])
def test_the_reason_a_block_is_not_run_holds(block: Block):
    REASONS[block.not_run_reason](block)


def test_a_wrong_command_in_a_server_block_is_caught():
    # The checks can fail: a mistyped option, an unknown command, a unit that does not exist.
    block = Block(REPO / "docs" / "web.md", 0, "sh", ["not-run=serves"], "walqueue-web q --allow-write\n")
    with pytest.raises(AssertionError):
        check_serving_block(block)
    for code in ("walqueue-ctl stats --nope\nsystemctl status walqueued\n",
                 "walqueue-ctl --socket /run/walqueue/walqueued.sock statz\n",
                 "systemctl enable --now walqueue-workr@orders\n",
                 "scripts/install --swich 0.2.0\n"):
        block = Block(REPO / "docs" / "operations.md", 0, "sh", ["not-run=server"], code)
        with pytest.raises(AssertionError):
            check_server_block(block)


# The programs whose commands the prose names inline, `walqueue-ctl --dsn URL migrate`.
PROGRAMS = {"walqueue-ctl": ctl_cli, "walqueued": daemon_cli.cli, "walqueue-worker": worker_cli.main,
            "walqueue-scheduler": schedule_cli.main, "walqueue-web": web_cli.main}
INLINE = re.compile(r"`((?:\.venv/bin/)?(?:walqueue-ctl|walqueued|walqueue-worker|walqueue-scheduler|walqueue-web)"
                    r"(?: [^`\n]*)?)`")


def option_names(command: click.Command) -> set[str]:
    return {name for parameter in command.params for name in parameter.opts + parameter.secondary_opts
            } | {"--help", "-h"}


def inline_problems(span: str) -> list[str]:
    """What is wrong with a command named in prose: an unknown command, or an option it lacks.
    Placeholders (URL, ID, [--queue NAME]) and missing arguments are the prose's business."""
    words = [word.strip("[]()|.,;") for word in span.split()]
    program = PROGRAMS[Path(words[0]).name]
    command, previous, problems = program, "", []
    for word in words[1:]:
        if command is program and isinstance(program, click.Group) and not word.startswith("-"):
            if word in program.commands:
                command = program.commands[word]
            elif re.fullmatch(r"[a-z][a-z-]+", word) and previous not in option_names(program):
                problems.append(f"{span}: no command {word!r}")  # not an option's value: a command
                break
        elif word.startswith("--"):
            known = option_names(command) | option_names(program)
            if word.split("=", 1)[0] not in known:
                problems.append(f"{span}: no option {word.split('=', 1)[0]}")
        previous = word
    return problems


def test_every_command_the_walked_documents_name_inline_is_a_real_command_with_real_options():
    spans = [(document.name, match.group(1)) for document in WALKED
             for match in INLINE.finditer(document.read_text())]
    spans += [(block.name, line[2:]) for document in WALKED for block in blocks(document)
              if block.language == "" for line in block.code.splitlines()
              if re.match(r"\$ (walqueue|\.venv/bin/walqueue)", line)]
    assert len(spans) > 30
    problems = [problem for name, span in spans for problem in inline_problems(span)]
    assert problems == []


def test_a_wrong_inline_command_is_caught():
    assert inline_problems("walqueue-ctl --dsn URL migrat")
    assert inline_problems("walqueue-ctl reserve worker-1 --limt 10")
    assert inline_problems("walqueued serve DIR --socket-mod 0660")
    assert inline_problems("walqueue-ctl --dsn URL [--queue NAME] stats") == []


def transcripts(document: Path) -> list[tuple[Block, str, str]]:
    """The `$ COMMAND` transcripts of a document: (block, command, the output shown after it)."""
    found = []
    for block in blocks(document):
        lines = block.code.splitlines()
        if block.language == "" and lines and lines[0].startswith("$ "):
            found.append((block, lines[0][2:], "\n".join(lines[1:])))
    return found


def test_every_script_a_walked_transcript_runs_exists_and_a_test_runs_it():
    tests_text = "\n".join(path.read_text() for path in (REPO / "tests").rglob("*.py"))
    scripts = [re.search(r"scripts/(\w+\.py)", command) for document in WALKED
               for _, command, _ in transcripts(document)]
    names = {match.group(1) for match in scripts if match}
    assert names >= {"crash_proof.py", "soak.py", "disk_sizing.py"}
    for name in names:
        assert (REPO / "scripts" / name).is_file(), name
        assert name in tests_text, f"no test runs scripts/{name}"


def shape(text: str) -> list[str]:
    """A report's lines without their figures: what must stay as the doc shows it."""
    return [re.sub(r"\s+", " ", re.sub(r"[\d.,]+", "N", line)).strip() for line in text.splitlines()]


def test_disk_sizing_prints_the_report_operations_md_shows():
    # The transcript's run took minutes at 100,000 tasks; 200 tasks print the same report.
    (transcript,) = [(command, output) for _, command, output in transcripts(REPO / "docs" / "operations.md")
                     if "scripts/disk_sizing.py" in command]
    command, output = transcript
    args = shlex.split(command)[2:]
    args[args.index("--tasks") + 1] = "200"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "disk_sizing.py"), *args],
                            capture_output=True, text=True, timeout=EXAMPLE_SECONDS, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert shape(result.stdout) == shape(output)


def test_the_no_queue_transcript_of_operations_md_is_what_verify_prints(tmp_path):
    (transcript,) = [(command, output) for _, command, output in transcripts(REPO / "docs" / "operations.md")
                     if "NO QUEUE" in output]
    command, output = transcript
    directory = shlex.split(command)[-1]
    queue = tmp_path / directory.lstrip("/") / "orders"
    queue.mkdir(parents=True)
    (queue / "LOCK").touch()  # a queue's file: verify names orders/ as a queue
    result = subprocess.run([str(Path(sys.prefix) / "bin" / "walqueue-ctl"), "verify", f"{tmp_path}{directory}"],
                            capture_output=True, text=True, timeout=EXAMPLE_SECONDS, env=child_env())
    *shown, exit_line = output.splitlines()
    assert exit_line == f"exit {result.returncode}"
    assert (result.stdout + result.stderr).replace(str(tmp_path), "").splitlines() == shown


def healthy_queue(directory: Path) -> None:
    """A queue as operations.md's `verify healthy` shows it: a snapshot at seq 8 (and one at 4
    before it), then one segment of two frames; ready 3, leased 1, completed 2."""
    from walqueue import Queue

    with Queue(directory) as queue:
        for number in range(1, 5):
            queue.put(f"task-{number}", {"n": number})
        queue.compact()                                            # snapshot at seq 4
        queue.put("task-5", {"n": 5})
        queue.put("task-6", {"n": 6})
        first, second = queue.reserve("w1", now=100, lease_seconds=60, limit=2)
        queue.ack(first, now=101)                                  # seq 8
        queue.compact()                                            # snapshot at seq 8
        queue.ack(second, now=102)                                 # seq 9
        queue.reserve("w1", now=103, lease_seconds=60)             # seq 10


def newest_segment(directory: Path) -> Path:
    return sorted(directory.glob("wal-*.log"))[-1]


def build_torn(directory: Path) -> None:
    healthy_queue(directory)
    segment = newest_segment(directory)
    head = segment.read_bytes()[:20]  # the first 20 bytes of a frame: one torn in its write
    with segment.open("ab") as file:
        file.write(head)


def build_zero(directory: Path) -> None:
    healthy_queue(directory)
    with newest_segment(directory).open("ab") as file:
        file.write(bytes(64))


def build_corrupt(directory: Path) -> None:
    healthy_queue(directory)
    segment = newest_segment(directory)
    data = bytearray(segment.read_bytes())
    data[-10] ^= 0x01  # inside the last frame: it fails its checksum, nothing valid follows
    segment.write_bytes(bytes(data))


def build_leftovers(directory: Path) -> None:
    healthy_queue(directory)
    (directory / "CURRENT.tmp").write_text("left by an interrupted compaction")
    (directory / "notes.txt").write_text("not a queue file")
    (directory / "snapshot-00000000000000000004.snap").write_bytes(b"an orphan")


# The directories of operations.md's verify transcripts, built to show what each shows.
VERIFY_DIRECTORIES = {"healthy": healthy_queue, "torn": build_torn, "zero": build_zero,
                      "corrupt": build_corrupt, "leftovers": build_leftovers}
VERIFY_TRANSCRIPTS = [(block, command, output) for block, command, output
                      in transcripts(REPO / "docs" / "operations.md") if command.startswith("walqueue-ctl verify ")
                      and shlex.split(command)[-1] in [*VERIFY_DIRECTORIES, "live"]]


def shape_matches(shown: str, printed: str) -> bool:
    """Whether a transcript's output has the printed report's shape; its `...` stands for any lines."""
    pattern = "\n".join(".*" if line.strip() == "..." else re.escape(shape(line)[0])
                         for line in shown.splitlines())
    return re.fullmatch(pattern, "\n".join(shape(printed)), re.DOTALL) is not None


@pytest.mark.parametrize("transcript", VERIFY_TRANSCRIPTS, ids=[block.name for block, _, _ in VERIFY_TRANSCRIPTS])
def test_a_verify_transcript_of_operations_md_has_the_shape_verify_prints(transcript, tmp_path):
    # The figures differ (the doc's queue had other payloads); the lines, verdicts, problem kinds
    # and exit code are what verify prints for a directory built to show the same.
    from walqueue import Queue

    block, command, output = transcript
    name = shlex.split(command)[-1]
    builder = VERIFY_DIRECTORIES.get(name, healthy_queue)
    builder(tmp_path / name)
    ctl = [str(Path(sys.prefix) / "bin" / "walqueue-ctl"), *shlex.split(command)[1:]]

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run(ctl, capture_output=True, text=True, timeout=EXAMPLE_SECONDS,
                              cwd=tmp_path, env=child_env())

    if name == "live":  # beside a running owner: this process holds the queue open
        with Queue(tmp_path / name):
            result = verify()
    else:
        result = verify()
    *shown, exit_line = output.splitlines()
    assert exit_line == f"exit {result.returncode}", result.stdout + result.stderr
    assert shape_matches("\n".join(shown), result.stdout), f"{block.name}:\n{result.stdout}"


def test_every_verify_transcript_of_operations_md_is_checked():
    shown = [shlex.split(command)[-1] for _, command, _ in transcripts(REPO / "docs" / "operations.md")
             if command.startswith("walqueue-ctl verify ")]
    checked = [shlex.split(command)[-1] for _, command, _ in VERIFY_TRANSCRIPTS]
    assert sorted(set(shown) - set(checked)) == ["/var/lib/walqueue-queues"]  # the NO QUEUE test's


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
