"""The install story of docs/operations.md, walked through in a temporary prefix:
scripts/install makes PREFIX/VERSION (a venv, the docs, the units rendered
with PREFIX/current), switches PREFIX/current to it and installs the units
and commands; `systemd-analyze verify` accepts the installed units; the
installed walqueued serves; an upgrade installs the next version beside the
first while the old daemon keeps serving, a restart runs the new one on the
same directory, and --switch rolls back. Also what the script refuses.

The walk-through installs twice with pip (the dependencies come from the
package index), so it takes a minute.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import walqueue

from ..unit.test_systemd_units import ANALYZE, analyze_verify
from .daemon import REPO, child_env

INSTALL_SECONDS = 300.0
CTL_SECONDS = 20.0
HIDDEN_BY_PROTECT_HOME = ("/home/", "/root/", "/run/user/")


def base_python() -> str:
    """The interpreter this test venv was made from (a venv is made from it)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def under_home(path: str) -> bool:
    return any((path + "/").startswith(prefix) for prefix in HIDDEN_BY_PROTECT_HOME)


def layout(root: Path) -> dict[str, Path]:
    return {"prefix": root / "opt" / "walqueue", "systemd": root / "etc" / "systemd" / "system",
            "sysusers": root / "usr" / "lib" / "sysusers.d", "bin": root / "usr" / "local" / "bin"}


def install(checkout: Path, root: Path, *args: str) -> subprocess.CompletedProcess:
    paths = layout(root)
    options = ["--prefix", paths["prefix"], "--systemd-dir", paths["systemd"],
               "--sysusers-dir", paths["sysusers"], "--bin-dir", paths["bin"], *args]
    env = child_env()
    env.pop("PYTHONPATH")  # the installed commands must run from their own venv alone
    return subprocess.run([str(checkout / "scripts" / "install"), *map(str, options)],
                          capture_output=True, text=True, cwd=root, env=env,
                          timeout=INSTALL_SECONDS)


def python_options() -> list[str]:
    # This machine's Python >= 3.12 may live under /root (pyenv): the units
    # could not run it, and the script refuses it unless told this install
    # is not for them.
    python = base_python()
    return ["--python", python, *(["--allow-home-python"] if under_home(python) else [])]


def installed_ctl(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = child_env()
    env.pop("PYTHONPATH")
    return subprocess.run([str(layout(root)["bin"] / "walqueue-ctl"), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=CTL_SECONDS)


def unit_value(path: Path, key: str) -> str:
    (found,) = [line.partition("=")[2] for line in path.read_text().splitlines()
                if line.startswith(f"{key}=")]
    return found


def install_key(checkout: Path) -> str:
    """The KEY `scripts/install` installs `checkout` as (PREFIX/KEY)."""
    result = subprocess.run([str(checkout / "scripts" / "install"), "--key"], capture_output=True,
                            text=True, timeout=CTL_SECONDS)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def next_checkout(root: Path, version: str) -> Path:
    """A copy of this checkout whose version is `version`."""
    checkout = root / f"checkout-{version}"
    checkout.mkdir()  # in /tmp, outside any git repository
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("src", "docs", "systemd", "scripts"):
        shutil.copytree(REPO / name, checkout / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, checkout / name)
    init = checkout / "src" / "walqueue" / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{walqueue.__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{walqueue.__version__}"', f'__version__ = "{version}"'))
    return checkout


@pytest.mark.slow
def test_install_serve_upgrade_and_roll_back_in_a_temporary_prefix(make_daemon, workdir):
    paths = layout(workdir)
    # A copy without git, so that its KEY (its version alone) stays put while the checkout is
    # edited; test_the_key_is_the_version_and_commit_of_a_git_checkout checks a git one's KEY.
    first_checkout = next_checkout(workdir, walqueue.__version__)
    first = install_key(first_checkout)
    assert first == walqueue.__version__
    result = install(first_checkout, workdir, *python_options())
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installed walqueue {first}" in result.stdout

    prefix = paths["prefix"]
    assert os.readlink(prefix / "current") == first
    venv = prefix / "current"
    for unit in ("walqueued.service", "walqueued@.service", "walqueued.socket", "walqueued@.socket"):
        installed = paths["systemd"] / unit
        assert installed.read_text() == (venv / "share" / "walqueue" / "systemd" / unit).read_text()
        documentation = unit_value(installed, "Documentation").removeprefix("file://")
        assert Path(documentation).is_file(), documentation  # the docs went where the units point
        if unit.endswith(".service"):
            assert unit_value(installed, "ExecStart").startswith(f"{venv}/bin/walqueued serve ")
            pre = unit_value(installed, "ExecStartPre").split()
            assert pre == ["/bin/sh", f"{venv}/share/walqueue/walqueued-preflight", str(venv)]
            assert Path(pre[1]).is_file()
    assert (paths["sysusers"] / "walqueue.conf").read_text() == (REPO / "systemd" / "walqueue.sysusers").read_text()
    assert os.readlink(paths["bin"] / "walqueued") == f"{venv}/bin/walqueued"
    assert installed_ctl(workdir, "--version").stdout == f"walqueue-ctl {walqueue.__version__}\n"
    for command in ("walqueued", "walqueue-ctl", "walqueue-worker", "walqueue-scheduler", "walqueue-web"):
        assert os.readlink(paths["bin"] / command) == f"{venv}/bin/{command}"  # operations.md's table
    if ANALYZE is not None:
        assert analyze_verify(paths["systemd"]) == (0, "")

    # The installed walqueued serves, started by the command the units run.
    directory, socket_path = workdir / "queue", str(workdir / "queue.sock")
    old = make_daemon(directory=directory, socket_path=socket_path, start=False)
    old.start(command=[str(paths["bin"] / "walqueued"), "serve", str(directory), "--socket", socket_path])
    assert installed_ctl(workdir, "--socket", socket_path, "put", "before-upgrade").returncode == 0

    # Upgrade: the next version goes beside the first while the old daemon serves on.
    second = f"{walqueue.__version__}.post1"
    second_checkout = next_checkout(workdir, second)
    assert install_key(second_checkout) == second  # a tree without git: its version alone
    result = install(second_checkout, workdir, *python_options())
    assert result.returncode == 0, result.stdout + result.stderr
    assert os.readlink(prefix / "current") == second
    assert (prefix / first / "bin" / "walqueued").exists()  # untouched, for a rollback
    assert installed_ctl(workdir, "--socket", socket_path, "put", "during-upgrade").returncode == 0
    assert old.terminate() == 0
    new = make_daemon(directory=directory, socket_path=socket_path, start=False)
    new.start(command=[str(paths["bin"] / "walqueued"), "serve", str(directory), "--socket", socket_path])
    assert installed_ctl(workdir, "--version").stdout == f"walqueue-ctl {second}\n"
    # The same checkout again while another is current: refused, naming the exact command.
    refused = install(first_checkout, workdir, *python_options())
    assert refused.returncode == 2 and "installed already" in refused.stderr
    assert f"scripts/install --switch {first} --prefix {prefix}" in refused.stderr
    listed = installed_ctl(workdir, "--socket", socket_path, "tasks", "--json")
    assert [line.split('"task_id":"')[1].split('"')[0] for line in listed.stdout.splitlines()] == [
        "before-upgrade", "during-upgrade"]

    # Rollback: switch the link back (the daemon restarts onto it).
    result = install(first_checkout, workdir, "--switch", first)
    assert result.returncode == 0, result.stderr
    assert os.readlink(prefix / "current") == first
    assert installed_ctl(workdir, "--version").stdout == f"walqueue-ctl {walqueue.__version__}\n"
    assert new.terminate() == 0

    # The same checkout again while it is current: nothing reinstalled, the links checked.
    marker = prefix / first / "kept"  # gone if the venv were made again
    marker.write_text("")
    (paths["bin"] / "walqueue-worker").unlink()
    again = install(first_checkout, workdir, *python_options())
    assert again.returncode == 0 and "current already" in again.stdout, again.stderr
    assert marker.exists()
    assert os.readlink(paths["bin"] / "walqueue-worker") == f"{venv}/bin/walqueue-worker"


def fake_installed(prefix: Path, key: str) -> None:
    """PREFIX/KEY as scripts/install leaves it, without its venv (no pip run)."""
    shared = prefix / key / "share" / "walqueue"
    (shared / "systemd").mkdir(parents=True)
    (prefix / key / "bin").mkdir()
    (prefix / key / "bin" / "walqueued").write_text("#!/bin/sh\n")
    (prefix / key / "bin" / "walqueued").chmod(0o755)
    for unit in (REPO / "systemd").glob("walqueue*.service"):
        shutil.copy2(unit, shared / "systemd" / unit.name)
    shutil.copy2(REPO / "systemd" / "walqueue.sysusers", shared / "walqueue.sysusers")


def test_the_key_is_the_version_and_commit_of_a_git_checkout():
    key = install_key(REPO)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, timeout=CTL_SECONDS).stdout.strip()
    assert key.startswith(f"{walqueue.__version__}-{head}")
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True,
                           text=True, timeout=CTL_SECONDS).stdout
    assert ("-dirty-" in key) == bool(dirty.strip())


def test_a_reinstall_of_an_installed_key_that_is_not_current_is_refused_with_the_switch_to_use(workdir):
    prefix = layout(workdir)["prefix"]
    key = install_key(REPO)
    fake_installed(prefix, key)
    fake_installed(prefix, "0.1.0")
    (prefix / "current").symlink_to("0.1.0")
    before = sorted(path.name for path in prefix.iterdir())
    result = install(REPO, workdir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"walqueue {key} is installed already ({prefix}/{key}), but not current" in result.stderr
    assert (f"To make it current: scripts/install --switch {key} --prefix {prefix} --systemd-dir "
            f"{layout(workdir)['systemd']}") in result.stderr
    assert sorted(path.name for path in prefix.iterdir()) == before
    assert os.readlink(prefix / "current") == "0.1.0"


def test_install_refuses_what_would_not_work_before_making_anything(workdir):
    nothing = install(REPO, workdir, "--switch", "9.9.9")
    assert nothing.returncode == 2 and "not an installed version" in nothing.stderr
    relative = install(REPO, workdir, "--prefix", "opt/walqueue")
    assert relative.returncode == 2 and "absolute path" in relative.stderr
    old = install(REPO, workdir, "--python", shutil.which("python3.11") or "/usr/bin/python3.11")
    if old.returncode == 2 and "no such command" not in old.stderr:
        assert "not Python 3.12 or later" in old.stderr and "Debian 12" in old.stderr
    assert not layout(workdir)["prefix"].exists() or not any(layout(workdir)["prefix"].iterdir())


@pytest.mark.skipif(not under_home(base_python()),
                    reason=f"this machine's Python ({base_python()}) is not under /home or /root")
def test_install_refuses_a_python_the_units_protect_home_would_hide(workdir):
    result = install(REPO, workdir, "--python", base_python())
    assert result.returncode == 2
    assert "ProtectHome=yes" in result.stderr and '"not found"' in result.stderr
    assert "Debian 12 and Ubuntu 22.04" in result.stderr  # and what to do about it
    assert not (layout(workdir)["prefix"] / walqueue.__version__).exists()
