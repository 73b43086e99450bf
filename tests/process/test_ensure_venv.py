"""scripts/_python.sh's ensure_venv, run twice at once on a fresh checkout (what
`scripts/serve` and `scripts/test` started together in two terminals do): one
makes .venv and installs, the other waits for it and then does nothing.

No real venv is made. A stand-in interpreter (first on PATH, so find_python
picks it) makes a stand-in venv whose bin/python logs each pip call, and its
`-m venv` waits, for at most MEET_SECONDS, for a second `-m venv` to arrive:
if one does, both were inside at once, which is the collision ("File exists:
.venv") the lock is there to prevent, and both fail. So without the lock the
two meet and the test is red (the unlocked ensure_venv below, the one the
scripts had, shows it); with the lock the second cannot arrive while the
first waits, and exactly one venv and one install happen. The cost of the
proof is one MEET_SECONDS wait per run.

Both locks are tried: flock(1), and the mkdir lock for systems without it
(a PATH that holds no flock).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .daemon import REPO

MEET_SECONDS = 3
RUN_SECONDS = 60.0
STAND_IN_PYTHON = f"""#!/bin/bash
# A stand-in interpreter: passes find_python's version check, makes a stand-in venv
# (a bin/python that is this script), and logs what it is asked to do.
log="$STAND_IN_LOG"
case "$1" in
  -c) exit 0 ;;
  -m)
    case "$2" in
      venv)
        echo "venv" >> "$log"
        for _ in $(seq 1 {MEET_SECONDS * 10}); do
          if [ "$(grep -c '^venv' "$log")" -ge 2 ]; then
            echo "stand-in python: another venv is being made at once: File exists: $3" >&2
            exit 1
          fi
          sleep 0.1
        done
        mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0 ;;
      pip) echo "pip ${{*:3}}" >> "$log"; exit 0 ;;
    esac ;;
esac
echo "stand-in python: unexpected arguments: $*" >&2
exit 2
"""
# ensure_venv as scripts/_python.sh had it before the lock: the broken variant.
UNLOCKED_ENSURE_VENV = """
ensure_venv() {
  local extra="$1"
  if [ ! -x .venv/bin/python ]; then
    "$(find_python)" -m venv .venv
  fi
  local stamp=".venv/.installed-$extra"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$extra]"
    touch "$stamp"
  fi
}
"""
# What ensure_venv and the stand-in run, for a PATH without flock.
TOOLS = ("bash", "cat", "cp", "dirname", "basename", "grep", "mkdir", "rm", "seq", "sleep", "touch",
         "ls", "sort", "sh")
INSTALLED = ["pip install --quiet --upgrade pip", "pip install --quiet -e .[test]"]


def fresh_checkout(root: Path, *, unlocked: bool = False, flock: bool = True) -> tuple[Path, str]:
    """A checkout without .venv holding scripts/_python.sh, and the PATH to run it with."""
    checkout = root / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    script = (REPO / "scripts" / "_python.sh").read_text()
    (checkout / "scripts" / "_python.sh").write_text(script + (UNLOCKED_ENSURE_VENV if unlocked else ""))
    (checkout / "pyproject.toml").write_text("")
    stand_in = root / "stand-in-bin"
    stand_in.mkdir()
    (stand_in / "python3.13").write_text(STAND_IN_PYTHON)
    (stand_in / "python3.13").chmod(0o755)
    if flock:
        return checkout, f"{stand_in}:/usr/bin:/bin"
    tools = root / "tools-bin"
    tools.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    return checkout, f"{stand_in}:{tools}"


def run_two_at_once(checkout: Path, path: str) -> list[subprocess.CompletedProcess]:
    command = ["bash", "-euo", "pipefail", "-c", "source scripts/_python.sh; ensure_venv test"]
    env = {"PATH": path, "HOME": str(checkout), "LC_ALL": "C", "STAND_IN_LOG": str(checkout / "stand-in.log")}
    bash = shutil.which("bash")
    processes = [subprocess.Popen([bash, *command[1:]], cwd=checkout, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=RUN_SECONDS)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=RUN_SECONDS)
    return results


def logged(checkout: Path) -> list[str]:
    return (checkout / "stand-in.log").read_text().splitlines()


@pytest.mark.parametrize("flock", [True, False], ids=["flock", "mkdir-lock"])
def test_two_ensure_venv_at_once_make_one_venv_and_install_once(tmp_path, flock):
    if flock and shutil.which("flock", path="/usr/bin:/bin") is None:
        pytest.skip("flock(1) is not installed")
    checkout, path = fresh_checkout(tmp_path, flock=flock)
    results = run_two_at_once(checkout, path)
    assert [result.returncode for result in results] == [0, 0], [result.stderr for result in results]
    assert logged(checkout) == ["venv", *INSTALLED]
    assert (checkout / ".venv" / ".installed-test").is_file()
    assert not (checkout / ".venv.lock.d").exists()


def test_without_the_lock_two_at_once_collide(tmp_path):
    checkout, path = fresh_checkout(tmp_path, unlocked=True)
    results = run_two_at_once(checkout, path)
    assert any(result.returncode != 0 and "File exists" in result.stderr for result in results)


def test_the_lock_is_free_once_ensure_venv_returns(tmp_path):
    # scripts/serve execs walqueued right after: an inherited lock would block every other script.
    if shutil.which("flock", path="/usr/bin:/bin") is None:
        pytest.skip("flock(1) is not installed")
    checkout, path = fresh_checkout(tmp_path)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(tmp_path / "stand-in-bin" / "python3.13", checkout / ".venv" / "bin" / "python")
    (checkout / ".venv" / ".installed-test").touch()
    result = subprocess.run(["bash", "-euo", "pipefail", "-c",
                             "source scripts/_python.sh; ensure_venv test; exec flock -n .venv.lock true"],
                            cwd=checkout, env={"PATH": path, "STAND_IN_LOG": str(checkout / "stand-in.log")}, capture_output=True, text=True,
                            timeout=RUN_SECONDS)
    assert result.returncode == 0, result.stderr
