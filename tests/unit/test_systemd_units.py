"""The systemd units in systemd/: `systemd-analyze verify` accepts them, a
broken unit is caught, the socket path the service passes to walqueued is
the one the .socket unit listens on, the template differs from the plain
service only in its per-queue paths, and the hardening keeps
`systemd-analyze security` in its SAFE band.

`systemd-analyze verify` needs the ExecStart binary to exist, so the units
are copied to a temporary directory with /opt/walqueue/current/bin/walqueued
rewritten to this environment's walqueued. It reports unknown directives and bad
values as warnings with exit status 0, so any line of output that names one
of our units is a failure too.
"""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
INSTALLED_BINARY = "/opt/walqueue/current/bin/walqueued"  # where scripts/install puts it
DOCS = UNITS.parent / "docs"
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (scripts/test installs the Debian "
    "package `systemd` when it runs as root)")
ANALYZE_SECONDS = 60
MAX_EXPOSURE = 2.0  # systemd-analyze security: up to 2.0 is "SAFE"


def walqueued_binary(tmp_path: Path) -> str:
    """This environment's walqueued, or a stand-in executable when it is not installed."""
    candidate = Path(sys.executable).parent / "walqueued"
    if candidate.exists():
        return str(candidate)
    stub = tmp_path / "walqueued"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return str(stub)


def copy_units(tmp_path: Path, edit=None) -> Path:
    """The units in a fresh directory, ExecStart pointed at an existing walqueued."""
    target = tmp_path / "units"
    target.mkdir()
    binary = walqueued_binary(tmp_path)
    for unit in UNITS.glob("walqueued*"):
        text = unit.read_text().replace(INSTALLED_BINARY, binary)
        if edit is not None:
            text = edit(unit.name, text)
        (target / unit.name).write_text(text)
    return target


def analyze_verify(directory: Path) -> tuple[int, str]:
    """Verify the plain units and an instance of each template; (status, our lines of output)."""
    names = ["walqueued.service", "walqueued.socket", "walqueued@orders.service", "walqueued@orders.socket"]
    result = subprocess.run([ANALYZE, "verify", *(str(directory / name) for name in names)],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS,
                            env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    output = result.stdout + result.stderr
    ours = [line for line in output.splitlines()
            if str(directory) in line or re.search(r"walqueued(@\w*)?\.(service|socket)", line)]
    return result.returncode, "\n".join(ours)


def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    status, output = analyze_verify(copy_units(tmp_path))
    assert (status, output) == (0, "")


BREAKAGES = {
    # Each edit starts at a line's beginning, so it hits the directive, not a comment naming it.
    "typo in a directive": ("walqueued.service", "\nProtectHome=yes", "\nProtectHom=yes"),
    "bad value": ("walqueued.service", "\nType=notify", "\nType=notifyy"),
    "missing binary": ("walqueued.service", "\nExecStart=", "\nExecStart=/nonexistent"),
    "typo in the template": ("walqueued@.service", "\nNoNewPrivileges=yes", "\nNoNewPrivilege=yes"),
    "bad socket mode": ("walqueued.socket", "\nSocketMode=0660", "\nSocketMode=rw-rw----"),
    "typo in the socket template": ("walqueued@.socket", "\nListenStream=", "\nListenStrem="),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_unit_fails_the_check(tmp_path, breakage):
    filename, old, new = BREAKAGES[breakage]

    def edit(name, text):
        if name != filename:
            return text
        assert old in text
        return text.replace(old, new, 1)

    status, output = analyze_verify(copy_units(tmp_path, edit))
    assert status != 0 or output != ""


def directives(filename: str) -> list[tuple[str, str]]:
    """(key, value) of every directive of a unit file, in order."""
    pairs = []
    for line in (UNITS / filename).read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            pairs.append((key, value))
    return pairs


def value(filename: str, key: str) -> str:
    (found,) = [v for k, v in directives(filename) if k == key]
    return found


@pytest.mark.parametrize("service, socket, state, runtime", [
    ("walqueued.service", "walqueued.socket", "walqueue", "walqueue"),
    ("walqueued@.service", "walqueued@.socket", "walqueue-queues/%i", "walqueue-queues/%i"),
])
def test_the_service_passes_walqueued_the_socket_the_socket_unit_listens_on(service, socket, state, runtime):
    assert value(service, "Type") == "notify"
    assert value(service, "StateDirectory") == state and value(service, "RuntimeDirectory") == runtime
    command = value(service, "ExecStart").split()
    assert command[:3] == [INSTALLED_BINARY, "serve", f"%S/{state}"]
    socket_path = command[command.index("--socket") + 1]
    assert socket_path == f"%t/{runtime}/walqueued.sock"
    assert value(socket, "ListenStream") == socket_path
    assert value(socket, "SocketMode") == "0660"
    assert value(service, "RuntimeDirectoryPreserve") == "yes"  # else a restart deletes the socket


def test_the_template_differs_from_the_service_only_in_its_per_queue_paths():
    plain = dict(directives("walqueued.service"))
    template = dict(directives("walqueued@.service"))
    assert plain.keys() == template.keys()
    differing = {key for key in plain if plain[key] != template[key]}
    assert differing == {"Description", "After", "StateDirectory", "RuntimeDirectory", "ExecStart", "Also"}
    assert all("%i" in template[key] for key in differing)


def test_no_template_instance_can_land_among_the_plain_queues_files():
    # An instance named CURRENT (or wal-...) once lived inside the plain queue's directory.
    for key in ("StateDirectory", "RuntimeDirectory"):
        plain = value("walqueued.service", key)
        instance = value("walqueued@.service", key).replace("%i", "CURRENT")
        assert not instance.startswith(plain + "/") and not plain.startswith(instance + "/")


@pytest.mark.parametrize("service, socket", [("walqueued.service", "walqueued.socket"),
                                             ("walqueued@.service", "walqueued@%i.socket")])
def test_enabling_the_service_enables_its_socket_too(service, socket):
    assert value(service, "Also") == socket


def test_the_template_speaks_of_its_own_socket_unit():
    assert "walqueued.socket" not in (UNITS / "walqueued@.service").read_text()


@pytest.mark.parametrize("unit", ["walqueued.service", "walqueued.socket", "walqueued@.service",
                                  "walqueued@.socket"])
def test_documentation_names_a_document_the_install_puts_there(unit):
    # scripts/install copies docs/*.md to VENV/share/doc/walqueue (tests/process/test_install.py).
    url = value(unit, "Documentation")
    prefix = "file:///opt/walqueue/current/share/doc/walqueue/"
    assert url.startswith(prefix) and (DOCS / url.removeprefix(prefix)).is_file()


def test_the_preflight_names_a_python_hidden_by_protect_home(tmp_path):
    # What ProtectHome=yes does to a venv made from a Python under /root: its
    # bin/python points at a path the service cannot reach.
    hidden = tmp_path / "hidden-venv"
    (hidden / "bin").mkdir(parents=True)
    (hidden / "bin" / "python").symlink_to("/root/.pyenv/versions/3.12.1/bin/missing-python3.12")
    result = subprocess.run(["/bin/sh", str(UNITS / "walqueued-preflight"), str(hidden)],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS)
    assert result.returncode == 1
    assert "under /home, /root or /run/user" in result.stderr and "ProtectHome=yes" in result.stderr
    assert "scripts/install --python" in result.stderr
    working = Path(sys.prefix)
    assert subprocess.run(["/bin/sh", str(UNITS / "walqueued-preflight"), str(working)],
                          env={**os.environ, "PYTHONPATH": str(UNITS.parent / "src")},
                          timeout=ANALYZE_SECONDS).returncode == 0


def test_the_units_run_the_preflight_of_the_venv_they_start():
    for service in ("walqueued.service", "walqueued@.service"):
        pre = value(service, "ExecStartPre").split()
        assert pre == ["/bin/sh", "/opt/walqueue/current/share/walqueue/walqueued-preflight",
                       "/opt/walqueue/current"]
        assert value(service, "ExecStart").startswith(pre[2] + "/bin/walqueued ")


def test_the_hardening_keeps_systemd_analyze_security_in_the_safe_band(tmp_path):
    units = copy_units(tmp_path)
    result = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager",
                             str(units / "walqueued.service")],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS)
    if "--offline" in result.stderr and result.returncode != 0:
        pytest.skip(f"this systemd-analyze has no security --offline: {result.stderr.strip()}")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is not installed")
def test_the_sysusers_file_creates_the_walqueue_user_and_group(tmp_path):
    (tmp_path / "etc").mkdir()
    result = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", "--dry-run",
                             str(UNITS / "walqueue.sysusers")],
                            capture_output=True, text=True, timeout=ANALYZE_SECONDS)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "Creating group 'walqueue'" in output and "Creating user 'walqueue'" in output
    assert {value("walqueued.service", "User"), value("walqueued.service", "Group"),
            value("walqueued.socket", "SocketUser"), value("walqueued.socket", "SocketGroup")} == {"walqueue"}
