"""systemd/walqueue-worker@.service and walqueue-worker.service (for the plain
walqueued.socket): `systemd-analyze verify` accepts them (and catches a broken copy), the
two differ only in their paths, each gives the handler a writable directory it starts in, it runs walqueue-worker from where walqueued@ runs walqueued and connects to
the socket walqueued@ listens on, its stop timeout covers the worker's own, its restart rule
matches walqueue-worker's exit codes, and the hardening keeps `systemd-analyze security`
low. As in test_systemd_units.py, the units are copied with ExecStart pointed at this
environment's binaries, and any output line naming one of them is a failure."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from walqueue import paths
from walqueue.worker import cli

UNITS = Path(__file__).resolve().parents[2] / "systemd"
WORKER_UNIT = "walqueue-worker@.service"
PLAIN_WORKER_UNIT = "walqueue-worker.service"
# Each worker unit, the daemon units it orders itself after, and the instance to verify.
WORKER_UNITS = {
    WORKER_UNIT: (("walqueued@.service", "walqueued@.socket"), "walqueue-worker@orders.service"),
    PLAIN_WORKER_UNIT: (("walqueued.service", "walqueued.socket"), "walqueue-worker.service"),
}
PROGRAMS = ("walqueue-worker", "walqueued")
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
    (found,) = [v for k, v in directives(filename) if k == key]
    return found


def installed_bin_directory():
    """Where the units expect the programs: the directory of walqueued@'s ExecStart."""
    return str(Path(value("walqueued@.service", "ExecStart").split()[0]).parent)


def copy_units(tmp_path, edit=lambda text: text, unit=WORKER_UNIT):
    """The worker unit and the daemon's units (which it orders itself after) in a fresh directory."""
    target = tmp_path / "units"
    target.mkdir()
    for name in (unit, *WORKER_UNITS[unit][0]):
        text = (UNITS / name).read_text()
        for program in PROGRAMS:
            binary = Path(sys.executable).parent / program
            if not binary.exists():
                pytest.skip(f"{binary} is not installed (pip install -e .)")
            text = text.replace(f"{installed_bin_directory()}/{program}", str(binary))
        (target / name).write_text(edit(text) if name == unit else text)
    return target


def analyze_verify(directory, unit=WORKER_UNIT):
    result = subprocess.run([ANALYZE, "verify", str(directory / WORKER_UNITS[unit][1])],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS,
                            env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    output = result.stdout + result.stderr
    ours = [line for line in output.splitlines() if str(directory) in line or "walqueue" in line]
    return result.returncode, "\n".join(ours)


@needs_analyze
@pytest.mark.parametrize("unit", WORKER_UNITS)
def test_systemd_analyze_verify_accepts_the_worker_unit(tmp_path, unit):
    assert analyze_verify(copy_units(tmp_path, unit=unit), unit) == (0, "")


@needs_analyze
@pytest.mark.parametrize("unit", WORKER_UNITS)
@pytest.mark.parametrize("old, new", [("ProtectHome=yes", "ProtectHom=yes"), ("Type=exec", "Type=exce"),
                                      ("ExecStart=", "ExecStart=/nonexistent "),
                                      ("StateDirectory=", "StateDirectory=/absolute")])
def test_a_broken_worker_unit_fails_the_check(tmp_path, unit, old, new):
    def edit(text):  # the directive, not a comment that mentions it
        edited = re.sub(f"^{re.escape(old)}", new, text, count=1, flags=re.MULTILINE)
        assert edited != text
        return edited

    status, output = analyze_verify(copy_units(tmp_path, edit, unit), unit)
    assert status != 0 or output != ""


def test_the_plain_worker_differs_from_the_template_only_in_its_per_queue_paths():
    plain, template = dict(directives(PLAIN_WORKER_UNIT)), dict(directives(WORKER_UNIT))
    assert plain.keys() == template.keys()
    differing = {key for key in plain if plain[key] != template[key]}
    assert differing == {"Description", "Wants", "After", "EnvironmentFile", "ExecStart",
                         "StateDirectory", "WorkingDirectory"}
    assert all("%i" in template[key] and "%i" not in plain[key] for key in differing)


def test_the_plain_worker_connects_to_the_socket_of_the_plain_walqueued():
    command = value(PLAIN_WORKER_UNIT, "ExecStart").split()
    daemon = value("walqueued.service", "ExecStart").split()
    assert command[1] == daemon[daemon.index("--socket") + 1] == value("walqueued.socket", "ListenStream")
    assert command[1].replace("%t", "/run") == paths.PLAIN_SOCKET
    assert value(PLAIN_WORKER_UNIT, "Wants") == "walqueued.socket"
    assert value(PLAIN_WORKER_UNIT, "EnvironmentFile") == f"{paths.CONFIGURATION_DIRECTORY}/worker.env"


@pytest.mark.parametrize("unit, directory", [(PLAIN_WORKER_UNIT, paths.PLAIN_WORKER_DIRECTORY),
                                             (WORKER_UNIT, paths.template_worker_directory("%i"))])
def test_the_handler_starts_in_a_writable_directory_of_its_own(unit, directory):
    # ProtectSystem=strict leaves only StateDirectory= writable: the handler starts in it, so a
    # relative path (failures.jsonl in docs/daemon.md) or $STATE_DIRECTORY lands there.
    assert value(unit, "ProtectSystem") == "strict"
    state = value(unit, "StateDirectory")
    assert f"/var/lib/{state}" == directory
    assert value(unit, "WorkingDirectory") == f"%S/{state}"
    # Apart from every queue's directory, so a handler's file can never land among a queue's.
    for queue_directory in (paths.PLAIN_QUEUE_DIRECTORY, paths.template_queue_directory("%i")):
        assert not (directory + "/").startswith(queue_directory + "/")
        assert not (queue_directory + "/").startswith(directory + "/")


def test_it_connects_to_the_socket_walqueued_at_the_same_instance_listens_on():
    command = value(WORKER_UNIT, "ExecStart").split()
    assert command[0] == f"{installed_bin_directory()}/walqueue-worker"
    daemon = value("walqueued@.service", "ExecStart").split()
    assert command[1] == daemon[daemon.index("--socket") + 1] == value("walqueued@.socket", "ListenStream")
    assert command[2:] == ["$WALQUEUE_HANDLER", "$WALQUEUE_WORKER_OPTIONS"]
    assert value(WORKER_UNIT, "EnvironmentFile") == "/etc/walqueue/worker-%i.env"
    assert "walqueued@%i.socket" in value(WORKER_UNIT, "After")


def test_stopping_and_restarting_follow_walqueue_workers_own_rules():
    defaults = {parameter.name: parameter.default for parameter in cli.main.params}
    stop_seconds = int(value(WORKER_UNIT, "TimeoutStopSec"))
    assert stop_seconds > defaults["stop_timeout_seconds"] + defaults["wait_seconds"]
    assert value(WORKER_UNIT, "RestartPreventExitStatus").split() == [str(cli.EXIT_USAGE)]
    assert value(WORKER_UNIT, "Restart") == "on-failure"


def test_the_handler_does_not_run_as_the_daemons_user():
    assert value(WORKER_UNIT, "DynamicUser") == "yes"
    assert value(WORKER_UNIT, "SupplementaryGroups") == value("walqueued@.service", "Group") == "walqueue"


@needs_analyze
@pytest.mark.parametrize("unit", WORKER_UNITS)
def test_the_hardening_keeps_systemd_analyze_security_low(tmp_path, unit):
    units = copy_units(tmp_path, unit=unit)
    result = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager",
                             str(units / WORKER_UNITS[unit][1])],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS)
    if "--offline" in result.stderr and result.returncode != 0:
        pytest.skip(f"this systemd-analyze has no security --offline: {result.stderr.strip()}")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout
