"""The layers hold: import-linter's contracts in pyproject.toml, run as a test.

The contracts (pyproject.toml, [tool.importlinter]) say: the library imports
nothing of the daemon layer (walqueue.connect()'s lazy clients excepted, SPEC
§9); the wire module imports no daemon; the daemon and its clients never
import each other; no client imports a Worker; no two modules import each
other, directly or around a cycle; the sans-IO service imports no socket,
selector, clock, signal or thread; walqueue-ctl's modules keep their layers
(no command module imports another); the library and walqueued's insides keep
their layers. The second test shows the check fails when a layer is crossed, on
a copy of the package with planted imports. A test of its own (import-linter has
no such contract) forbids importing another package's private names.
"""

from __future__ import annotations

import ast
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
    with open(copy / "protocol" / "framing.py", "a") as protocol:
        protocol.write("\nimport walqueue.daemon.recorder  # planted\n")
    with open(copy / "queue.py", "a") as queue:
        queue.write("\nimport walqueue.unix_socket  # planted\n")
    with open(copy / "ctl" / "admin.py", "a") as admin:
        admin.write("\nimport walqueue.ctl.tasks  # planted: one command module importing another\n")
    with open(copy / "client" / "aio.py", "a") as client:  # walqueue.worker.aio uses it: a cycle
        client.write("\nimport walqueue.worker.aio  # planted\n")
    with open(copy / "codec.py", "a") as codec:
        codec.write("\nimport walqueue.engine  # planted: the frame codec over the writer\n")
    with open(copy / "daemon" / "connection.py", "a") as connection:
        connection.write("\nimport walqueue.daemon.loop  # planted: a shell importing the loop\n")
    result = lint_imports(tmp_path / "src")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    for contract_id in ("library", "wire", "sans-io-service", "ctl", "clients-not-workers", "acyclic",
                        "library-layers", "daemon-layers"):
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


def package_of(path: Path, root: Path) -> str:
    """The package a module under ``root`` belongs to: walqueue/daemon/loop.py -> walqueue.daemon."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1])


def imported_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` in ``package`` reads its names from."""
    if node.level == 0:
        return node.module or ""
    base = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_imports(root: Path) -> list[str]:
    """Every ``from M import _name`` under ``root`` where M is in another package than the importer."""
    found = []
    for path in sorted(root.rglob("*.py")):
        package = package_of(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = imported_module(node, package)
            if not module.startswith("walqueue"):
                continue
            # A package's names (its __init__'s, or its submodules) are that package's;
            # a module's are its parent package's.
            is_package = (root / Path(*module.split(".")) / "__init__.py").exists()
            source_package = module if is_package else module.rpartition(".")[0]
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.endswith("__")  # __version__ is public
                if private and source_package != package:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {alias.name} from {module}")
    return found


def test_no_module_imports_another_packages_private_names():
    assert private_imports(REPO / "src") == [], "make the name public where it is defined, or move it"


def test_a_private_name_imported_across_packages_is_found(tmp_path):
    (tmp_path / "walqueue" / "daemon").mkdir(parents=True)
    for name in ("walqueue/__init__.py", "walqueue/daemon/__init__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "walqueue" / "queue.py").write_text("def _hidden(): pass\n")
    (tmp_path / "walqueue" / "engine.py").write_text("from .queue import _hidden  # same package: allowed\n")
    (tmp_path / "walqueue" / "daemon" / "service.py").write_text(
        "from walqueue.queue import _hidden\nfrom ..queue import _hidden as again\n"
        "from .loop import _own  # its own package: allowed\n")
    assert private_imports(tmp_path) == ["walqueue/daemon/service.py:1: _hidden from walqueue.queue",
                                         "walqueue/daemon/service.py:2: _hidden from walqueue.queue"]
