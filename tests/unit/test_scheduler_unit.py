"""systemd/walqueue-scheduler@.service: `systemd-analyze verify` accepts it (and catches a
broken copy), it runs walqueue-scheduler from where walqueued@ runs walqueued and puts into
the socket walqueued@ listens on, its restart rule matches walqueue-scheduler's exit codes,
it does not run as the daemon's user, and the hardening keeps `systemd-analyze security` in
its SAFE band. As in test_worker_unit.py, the units are copied with ExecStart pointed at this
environment's binaries, and any output line naming one of them is a failure."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from walqueue.schedule import cli

UNITS = Path(__file__).resolve().parents[2] / "systemd"
DOCS = UNITS.parent / "docs"
UNIT = "walqueue-scheduler@.service"
PROGRAMS = ("walqueue-scheduler", "walqueued")
ANALYZE = shutil.which("systemd-analyze")
ANALYZE_SECONDS = 60
MAX_EXPOSURE = 2.0
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def directives(filename):
    pairs = []
    for line in (UNITS / filename).read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            pairs.append((key, value))
    return pairs


def value(filename, key):
    found = [v for k, v in directives(filename) if k == key]
    assert len(found) == 1, (key, found)
    return found[0]


def installed_bin_directory():
    """Where the units expect the programs: the directory of walqueued@'s ExecStart."""
    return str(Path(value("walqueued@.service", "ExecStart").split()[0]).parent)


def copy_units(tmp_path, edit=lambda text: text):
    """The scheduler unit and walqueued@'s units (which it orders itself after) in a fresh directory."""
    target = tmp_path / "units"
    target.mkdir()
    for name in (UNIT, "walqueued@.service", "walqueued@.socket"):
        text = (UNITS / name).read_text()
        for program in PROGRAMS:
            binary = Path(sys.executable).parent / program
            if not binary.exists():
                pytest.skip(f"{binary} is not installed (pip install -e .)")
            text = text.replace(f"{installed_bin_directory()}/{program}", str(binary))
        (target / name).write_text(edit(text) if name == UNIT else text)
    return target


def analyze_verify(directory):
    result = subprocess.run([ANALYZE, "verify", str(directory / "walqueue-scheduler@orders.service")],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS,
                            env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    output = result.stdout + result.stderr
    ours = [line for line in output.splitlines() if str(directory) in line or "walqueue" in line]
    return result.returncode, "\n".join(ours)


@needs_analyze
def test_systemd_analyze_verify_accepts_the_scheduler_unit(tmp_path):
    assert analyze_verify(copy_units(tmp_path)) == (0, "")


@needs_analyze
@pytest.mark.parametrize("old, new", [("PrivateNetwork=yes", "PrivateNetwrk=yes"), ("Type=exec", "Type=exce"),
                                      ("ExecStart=", "ExecStart=/nonexistent ")])
def test_a_broken_scheduler_unit_fails_the_check(tmp_path, old, new):
    def edit(text):  # the directive, not a comment that mentions it
        edited = re.sub(f"^{re.escape(old)}", new, text, count=1, flags=re.MULTILINE)
        assert edited != text
        return edited

    status, output = analyze_verify(copy_units(tmp_path, edit))
    assert status != 0 or output != ""


def test_it_puts_into_the_socket_walqueued_at_the_same_instance_listens_on():
    command = value(UNIT, "ExecStart").split()
    assert command[0] == f"{installed_bin_directory()}/walqueue-scheduler"
    daemon = value("walqueued@.service", "ExecStart").split()
    assert command[1] == daemon[daemon.index("--socket") + 1] == value("walqueued@.socket", "ListenStream")
    assert command[2:] == ["/etc/walqueue/schedule-%i.toml", "$WALQUEUE_SCHEDULER_OPTIONS"]
    assert value(UNIT, "EnvironmentFile") == "-/etc/walqueue/scheduler-%i.env"  # optional
    assert "walqueued@%i.socket" in value(UNIT, "After")
    assert value(UNIT, "ExecStartPre") == value("walqueue-worker@.service", "ExecStartPre")


def test_restarting_follows_walqueue_schedulers_exit_codes():
    assert value(UNIT, "RestartPreventExitStatus").split() == [str(cli.EXIT_USAGE)]
    assert value(UNIT, "Restart") == "on-failure"


def test_it_does_not_run_as_the_daemons_user_and_names_its_document():
    assert value(UNIT, "DynamicUser") == "yes"
    assert value(UNIT, "SupplementaryGroups") == value("walqueued@.service", "Group") == "walqueue"
    url = value(UNIT, "Documentation")
    prefix = "file:///opt/walqueue/current/share/doc/walqueue/"
    assert url.startswith(prefix) and (DOCS / url.removeprefix(prefix)).is_file()


@needs_analyze
def test_the_hardening_keeps_systemd_analyze_security_in_the_safe_band(tmp_path):
    units = copy_units(tmp_path)
    result = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager",
                             str(units / "walqueue-scheduler@orders.service")],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS)
    if "--offline" in result.stderr and result.returncode != 0:
        pytest.skip(f"this systemd-analyze has no security --offline: {result.stderr.strip()}")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout
