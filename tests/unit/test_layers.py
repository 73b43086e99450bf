"""The layers hold: import-linter's contracts in pyproject.toml, run as a test.

The contracts (pyproject.toml, [tool.importlinter]) say: the library imports
nothing of the daemon layer (walqueue.connect()'s lazy clients excepted, SPEC
§9); the wire module imports no daemon; the daemon and its clients never
import each other; the sans-IO service imports no socket, selector, clock,
signal or thread; walqueue-ctl's modules keep their layers (no command
module imports another). The second test shows the check fails when a layer
is crossed, on a copy of the package with planted imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "walqueue"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def lint_imports(source_root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(source_root))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(REPO / "pyproject.toml")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    result = lint_imports(REPO / "src")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_crossed_layer_breaks_its_contract(tmp_path):
    copy = tmp_path / "src" / "walqueue"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "daemon" / "service.py", "a") as service:
        service.write("\nimport time  # planted\n")
    with open(copy / "protocol.py", "a") as protocol:
        protocol.write("\nimport walqueue.daemon.recorder  # planted\n")
    with open(copy / "queue.py", "a") as queue:
        queue.write("\nimport walqueue.unix_socket  # planted\n")
    with open(copy / "ctl" / "admin.py", "a") as admin:
        admin.write("\nimport walqueue.ctl.tasks  # planted: one command module importing another\n")
    result = lint_imports(tmp_path / "src")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    for contract_id in ("library", "wire", "sans-io-service", "ctl"):
        # Compared without whitespace: lint-imports wraps long lines at 80 columns.
        expected = "".join(contracts()[contract_id]["name"].split()) + "BROKEN"
        assert expected in "".join(output.split()), output


def library_and_daemon_layer() -> tuple[set[str], set[str]]:
    library = set(contracts()["library"]["source_modules"]) | {"walqueue"}
    daemon_layer = {name.removesuffix(".**") for name in contracts()["library"]["forbidden_modules"]}
    return library, daemon_layer


def test_every_module_of_the_package_is_in_a_layer():
    library, daemon_layer = library_and_daemon_layer()
    unplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name not in library and not any(name == top or name.startswith(top + ".") for top in daemon_layer):
            unplaced.append(name)
    assert unplaced == [], (f"{unplaced}: add each to the library contract's source_modules or the daemon "
                            "layer's forbidden_modules in pyproject.toml")


def test_walqueue_pg_is_named_by_the_contracts_once_it_exists():
    if (PACKAGE / "pg").exists() or (PACKAGE / "pg.py").exists():
        forbidden = contracts()["library"]["forbidden_modules"]
        assert "walqueue.pg" in forbidden, "walqueue.pg exists now: add it to the forbidden modules"
