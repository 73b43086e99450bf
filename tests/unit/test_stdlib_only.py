"""The library layer (SPEC: `walqueue` and `walqueue.cli`) imports nothing
outside the standard library. Only the daemon layer may use msgspec and
click.

The check parses the sources with `ast` (nothing is imported), so an import
hidden in a function, behind `try: ... except ImportError`, or spelled
`importlib.import_module("x")` is caught as well. A library module that
imports a daemon-layer module is caught too: that would pull msgspec in
transitively.
"""

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "walqueue"
PACKAGE_NAME = "walqueue"

# SPEC §8's daemon layer (the wire protocol, the daemon, its clients,
# walqueue-ctl, ...) and SPEC §9's PostgreSQL backend: the modules the import
# contract of the library forbids (pyproject.toml, tests/unit/test_layers.py),
# by their name under walqueue.
DAEMON_LAYER = {
    name.removesuffix(".**").split(".")[1]
    for contract in tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"] if contract["id"] == "library"
    for name in contract["forbidden_modules"]
}
# SPEC §9: walqueue.connect() imports the client it returns only when called,
# so these function bodies in these modules may import those clients.
LAZY_IMPORTERS = {("walqueue", "connect"): {"walqueue.client", "walqueue.pg"}}


def module_name(path: Path) -> str:
    """Dotted name of a source file under PACKAGE, e.g. walqueue.cli."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_daemon_layer(dotted: str) -> bool:
    parts = dotted.split(".")
    return len(parts) >= 2 and parts[0] == PACKAGE_NAME and parts[1] in DAEMON_LAYER


def library_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if not is_daemon_layer(module_name(path)))


def resolve_relative(level: int, module: str | None, importer: str, is_package: bool) -> str:
    """Absolute name of `from <.. level> module import ...` inside importer."""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imported_names(source: str, importer: str = "walqueue.example", is_package=False):
    """Every absolute module name the source imports, with its line number.
    For `from X import a, b` both X and X.a, X.b are reported (a and b may be
    submodules)."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (importer, node.name) in LAZY_IMPORTERS:
            allowed = LAZY_IMPORTERS[importer, node.name]
            lazy = imported_names(ast.unparse(ast.Module(body=node.body, type_ignores=[])),
                                  importer, is_package)
            found.extend((name, line + node.lineno) for name, line in lazy
                         if not any(name == module or name.startswith(module + ".")
                                    for module in allowed))
            node.body = [ast.Pass()]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = resolve_relative(node.level, node.module, importer, is_package)
            else:
                base = node.module
            found.append((base, node.lineno))
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        elif isinstance(node, ast.Call):
            function = node.func
            name = (
                function.attr
                if isinstance(function, ast.Attribute)
                else function.id
                if isinstance(function, ast.Name)
                else None
            )
            if name in {"import_module", "__import__"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.append((first.value, node.lineno))
                else:
                    found.append(("<dynamic import>", node.lineno))
    return found


def forbidden_imports(source: str, importer: str = "walqueue.example", is_package=False):
    """(name, line) of every import a library-layer module may not make."""
    problems = []
    for name, line in imported_names(source, importer, is_package):
        top = name.split(".")[0]
        if name == "<dynamic import>":
            problems.append((name, line))
        elif top == PACKAGE_NAME:
            if is_daemon_layer(name):
                problems.append((name, line))
        elif top not in sys.stdlib_module_names:
            problems.append((name, line))
    return problems


# -- the checker itself -------------------------------------------------------


@pytest.mark.parametrize(
    "snippet",
    [
        "import msgspec",
        "import msgspec.msgpack",
        "from msgspec import Struct",
        "from msgspec.msgpack import Decoder",
        "import json, click",
        "import msgspec as m",
        "def f():\n    import msgspec",
        "try:\n    import msgspec\nexcept ImportError:\n    msgspec = None",
        "if False:\n    import click",
        "class C:\n    def m(self):\n        from click import group",
        "import importlib\nimportlib.import_module('msgspec')",
        "from importlib import import_module\nimport_module('click')",
        "__import__('msgspec')",
        "import importlib\nname = 'msg' + 'spec'\nimportlib.import_module(name)",
        "from . import protocol",
        "from .protocol import Hello",
        "from .daemon.cli import main",
        "from walqueue import client",
        "from walqueue.client import Client",
        "import walqueue.ctl",
        "import numpy",
        "import attr",
    ],
)
def test_the_checker_catches_a_third_party_or_daemon_layer_import(snippet):
    assert forbidden_imports(textwrap.dedent(snippet)) != []


@pytest.mark.parametrize(
    "snippet",
    [
        "import json, os, hashlib, struct, fcntl",
        "import os.path",
        "from collections.abc import Mapping",
        "from __future__ import annotations",
        "from . import codec",
        "from .errors import CorruptStore",
        "from walqueue import errors",
        "from walqueue.state import State",
        "import walqueue",
        "import importlib\nimportlib.import_module('json')",
    ],
)
def test_the_checker_accepts_standard_library_and_library_layer_imports(snippet):
    assert forbidden_imports(snippet) == []


def test_only_connect_in_the_package_init_may_import_a_client_lazily():
    lazy = "def connect(target):\n    from .client import Client\n    from .pg import Client\n"
    assert forbidden_imports(lazy, "walqueue", is_package=True) == []
    assert forbidden_imports(lazy.replace("connect", "other"), "walqueue", is_package=True) != []
    assert forbidden_imports(lazy + "    import msgspec\n", "walqueue", is_package=True) != []
    assert forbidden_imports("def connect(t):\n    from .ctl import main\n", "walqueue",
                             is_package=True) != []


def test_the_checker_resolves_relative_imports_from_the_package_init():
    assert forbidden_imports("from . import daemon", "walqueue", is_package=True) != []
    assert forbidden_imports("from . import queue", "walqueue", is_package=True) == []
    assert forbidden_imports("from .. import daemon", "walqueue.sub.mod") != []


def test_the_checker_reports_the_line_of_the_import():
    assert forbidden_imports("import os\n\nimport msgspec\n") == [("msgspec", 3)]


# -- the library ---------------------------------------------------------------


def test_the_library_layer_is_where_the_spec_says():
    names = {module_name(path) for path in library_modules()}
    assert {"walqueue", "walqueue.cli", "walqueue.queue"} <= names
    assert not any(is_daemon_layer(name) for name in names)


@pytest.mark.parametrize("path", library_modules(), ids=lambda path: module_name(path))
def test_a_library_layer_module_imports_only_the_standard_library(path):
    source = path.read_text(encoding="utf-8")
    name = module_name(path)
    problems = forbidden_imports(source, name, is_package=path.name == "__init__.py")
    assert problems == [], f"{path.relative_to(PACKAGE.parent)} imports {problems}"


BLOCKER = """
import importlib, pkgutil, sys
from pathlib import Path

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"msgspec", "click"}:
            raise ImportError(f"third-party import of {name} in the library layer")
        return None

sys.meta_path.insert(0, Blocked())
for name in list(sys.modules):
    if name.split(".")[0] in {"msgspec", "click"}:
        del sys.modules[name]
for name in sys.argv[1:]:
    importlib.import_module(name)
print("ok")
"""


def test_the_library_layer_imports_with_msgspec_and_click_unavailable():
    names = sorted(module_name(path) for path in library_modules())
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER, *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
