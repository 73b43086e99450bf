"""The docs' tables of exit codes, options and installed files agree with the code.

Each program's exit codes are written three times: as constants in its module,
in its --help, and in a table of the docs. These tests read all three and
require the same codes everywhere (the meanings are worded for each place and
are not compared). The option tables of `walqueued serve` and `walqueue-worker`
must name every option the program has, with its default; the install table
of operations.md must name every command scripts/install links and the units
table every file in systemd/.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from walqueue.ctl import cli as ctl_cli
from walqueue.ctl.errors import EXIT_MEANINGS
from walqueue.daemon import cli as daemon_cli
from walqueue.daemon import exits as daemon_exits
from walqueue.schedule import cli as schedule_cli
from walqueue.worker import cli as worker_cli

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
HELP_CODE = re.compile(r"^\s{1,6}(\d{1,3})\s{2}\S")


def section(document: str, heading: str) -> str:
    """The text under `heading` (a whole line), up to the next heading of its level or above."""
    text = (DOCS / document).read_text()
    lines = text.splitlines()
    (start,) = [index for index, line in enumerate(lines) if line == heading]
    level = len(heading) - len(heading.lstrip("#"))
    end = next((index for index in range(start + 1, len(lines))
                if re.match(rf"^#{{1,{level}}} ", lines[index])), len(lines))
    return "\n".join(lines[start + 1:end])


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of `text`: rows of cells, the header row first, without the rule."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def table_codes(document: str, heading: str) -> set[int]:
    """The codes of the exit-code table under `heading` (first column `code` or `exit`)."""
    (table,) = [table for table in tables(section(document, heading))
                if table[0][0] in ("code", "exit")]
    return {int(row[0]) for row in table[1:]}


def help_text(command: click.Command, *args: str) -> str:
    result = CliRunner().invoke(command, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def help_codes(text: str) -> set[int]:
    """The codes listed under "Exit codes:" in a --help."""
    lines = text.splitlines()
    (start,) = [index for index, line in enumerate(lines) if line.strip() == "Exit codes:"]
    codes = set()
    for line in lines[start + 1:]:
        if not line.strip() or not line.startswith(" "):
            break
        match = HELP_CODE.match(line)
        if match:
            codes.add(int(match.group(1)))
    return codes


def constants(module) -> set[int]:
    return {value for name, value in vars(module).items() if name.startswith("EXIT_") and isinstance(value, int)}


def test_walqueueds_exit_codes_agree_in_its_module_its_help_and_both_docs():
    codes = constants(daemon_exits)
    assert codes == set(range(7))
    assert help_codes(help_text(daemon_cli.cli, "serve")) == codes
    assert table_codes("protocol.md", "## Exit codes of `walqueued`") == codes
    assert table_codes("daemon.md", "## Running walqueued") == codes


def test_walqueue_ctls_exit_codes_agree_in_its_module_its_help_and_operations_md():
    codes = set(EXIT_MEANINGS)
    assert help_codes(help_text(ctl_cli)) == codes
    assert table_codes("operations.md", "### Exit codes") == codes


def test_the_exit_codes_of_walqueue_ctl_backup_agree_with_backup_md():
    codes = help_codes(help_text(ctl_cli, "backup"))
    assert codes >= {0, 2, 3, 4, 8, 9, 10}
    assert table_codes("backup.md", "### Exit codes of `walqueue-ctl backup`") == codes


def test_walqueue_workers_exit_codes_agree_in_its_module_its_help_and_daemon_md():
    codes = constants(worker_cli)
    assert help_codes(help_text(worker_cli.main)) == codes
    assert table_codes("daemon.md", "### walqueue-worker: a worker you don't write yourself") == codes


def test_walqueue_schedulers_exit_codes_agree_in_its_module_its_help_and_scheduler_md():
    codes = constants(schedule_cli)
    assert help_codes(help_text(schedule_cli.main)) == codes
    assert table_codes("scheduler.md", "## The log and the exit codes") == codes


def option_rows(document: str, heading: str) -> dict[str, str]:
    """{--option: default cell} of the option table under `heading`."""
    (table,) = [table for table in tables(section(document, heading)) if table[0][0] == "option"]
    return {row[0].strip("`").split()[0]: row[1].strip("`") for row in table[1:]}


def shown_default(option: click.Option) -> str | None:
    """An option's default as a table shows it (None: no value, the table says what happens)."""
    if option.default is None or option.is_flag:
        return None
    if isinstance(option.default, float) and option.default.is_integer() and option.name != "compact_wal_ratio":
        return str(int(option.default))
    return str(option.default)


@pytest.mark.parametrize("document, heading, command", [
    ("daemon.md", "## Running walqueued", daemon_cli.cli.commands["serve"]),
    ("daemon.md", "### walqueue-worker: a worker you don't write yourself", worker_cli.main),
])
def test_an_option_table_names_every_option_with_its_default(document, heading, command):
    rows = option_rows(document, heading)
    options = {parameter.opts[0]: parameter for parameter in command.params
               if isinstance(parameter, click.Option) and not parameter.hidden
               and parameter.opts[0] not in ("--version", "--help")}
    assert rows.keys() == options.keys()
    for name, option in options.items():
        default = shown_default(option)
        if default is not None:
            assert rows[name] == default, name


def test_the_install_table_names_every_command_scripts_install_links():
    install = (REPO / "scripts" / "install").read_text()
    (commands,) = re.findall(r'for command in ([\w -]+); do\n(?:.*\n){0,3}?\s+ln -sfn "\$prefix/current/bin/\$command" '
                             r'"\$bin_dir/\$command"', install)
    linked = commands.split()
    assert set(linked) == {"walqueued", "walqueue-ctl", "walqueue-worker", "walqueue-scheduler", "walqueue-web"}
    (table,) = tables(section("operations.md", "### On a server: scripts/install"))
    (row,) = [row for row in table if row[0].startswith("`/usr/local/bin/")]
    assert set(re.findall(r"`(?:/usr/local/bin/)?([\w-]+)`", row[0])) == set(linked)


def test_the_units_table_names_every_file_in_systemd():
    (table,) = [table for table in tables(section("operations.md", "## The systemd units"))
                if table[0][0] == "file"]
    named = {name for row in table[1:] for name in re.findall(r"`([\w@.-]+)`", row[0])}
    assert named == {path.name for path in (REPO / "systemd").iterdir()}


def test_the_docs_speak_of_the_software_not_of_issue_numbers():
    files = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((REPO / "systemd").iterdir())]
    found = {str(file.relative_to(REPO)): re.findall(r"\bissues? \d+", file.read_text(), re.IGNORECASE)
             for file in files}
    assert {name: hits for name, hits in found.items() if hits} == {}


QUOTED_CONSTANT = re.compile(r"`([A-Z][A-Z0-9_]{3,})` \(([^)]*)\)")
QUOTED_VALUE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*(KiB|MiB|GiB)?(?:\s*([+/])\s*(\d[\d,]*(?:\.\d+)?))?")
UNITS = {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def code_constants() -> dict[str, list[float]]:
    """Every numeric upper-case module constant of the package, by name (a name may recur)."""
    import importlib
    import pkgutil

    import walqueue

    found: dict[str, list[float]] = {}
    for module_info in pkgutil.walk_packages(walqueue.__path__, "walqueue."):
        try:
            module = importlib.import_module(module_info.name)
        except ImportError:  # an optional extra (psycopg, cronsim) that is not installed
            continue
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, int | float) and not isinstance(value, bool):
                found.setdefault(name, []).append(value)
    return found


def quoted_value(text: str) -> float | None:
    """The figure a doc gives in `CONSTANT` (FIGURE ...): 1,024, 8 MiB, 0.25, 24 + 8, 16 MiB / 6."""
    match = QUOTED_VALUE.match(text)
    if not match:
        return None
    number, unit, operator, operand = match.groups()
    value = float(number.replace(",", "")) * UNITS[unit]
    if operator == "+":
        value += float(operand.replace(",", ""))
    elif operator == "/":
        value = value // float(operand.replace(",", ""))
    return value


def wrong_quotes(text: str, constants: dict[str, list[float]]) -> tuple[int, list[str]]:
    """(how many quotes of a constant were checked, those whose figure the code does not have)."""
    checked, wrong = 0, []
    for name, quoted in QUOTED_CONSTANT.findall(text):
        value = quoted_value(quoted)
        if name not in constants or value is None:
            continue  # not a number of ours (`LOCK` (...)), or words (`OVERDRAFT_BYTES` (one largest frame))
        checked += 1
        if not any(abs(candidate - value) <= 1e-9 * max(1.0, abs(value)) for candidate in constants[name]):
            wrong.append(f"{name} ({quoted}) but the code has {constants[name]}")
    return checked, wrong


def test_every_constant_the_docs_quote_has_the_value_they_give():
    constants = code_constants()
    total = 0
    for document in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        checked, wrong = wrong_quotes(document.read_text(), constants)
        total += checked
        assert wrong == [], document.name
    assert total >= 30
    # The check can fail: a figure the code does not have is caught.
    assert wrong_quotes("`TURN_WORK_SECONDS` (0.5) and `LARGE_FRAME_BYTES` (2 MiB)", constants)[1] != []
    assert len(wrong_quotes("`TURN_WORK_SECONDS` (0.5) and `LARGE_FRAME_BYTES` (2 MiB)", constants)[1]) == 2


def test_the_json_lines_front_ends_exit_codes_agree_with_the_readme():
    from walqueue import cli

    codes = {cli.EXIT_OK, cli.EXIT_USAGE, cli.EXIT_LOCKED, cli.EXIT_CORRUPT, cli.EXIT_REOPEN_FAILED}
    readme = (REPO / "README.md").read_text()
    sentence = readme[readme.index("Exit codes: 0 at end of input"):].split(".\n")[0]
    assert {int(code) for code in re.findall(r"(?:: |, )(\d+) ", sentence)} == codes
