"""One source for each path: walqueue.paths says what the units in systemd/ use,
the units are checked against it, and every /var/lib/walqueue... and
/run/walqueue... path in README.md, docs/, systemd/, scripts/, the sources and
the rendered --help of every program is one the units really use.

The mistake this is for: the template units keep a queue in
/var/lib/walqueue-queues/NAME with its socket in /run/walqueue-queues/NAME/,
while docs and help texts went on saying /var/lib/walqueue/NAME and
/run/walqueue/NAME/ (the layout before the template moved). Only the upgrade
note that tells how to move such a queue may name the old layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from walqueue import paths
from walqueue.ctl import cli as ctl_cli
from walqueue.daemon import cli as daemon_cli
from walqueue.schedule import cli as schedule_cli
from walqueue.verify import verify_directory
from walqueue.worker import cli as worker_cli

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
PATH = re.compile(r"/(?:var/lib|run)/walqueue[A-Za-z0-9._%@$/{}-]*")
# Names that stand for a template instance in the docs and units.
INSTANCE_NAMES = {"NAME", "%i", "orders", "emails", "CURRENT"}
# The upgrade note for queues kept in the old layout names it, to move them.
OLD_LAYOUT_SECTION = ("docs/upgrades.md", "### Template queues moved to /var/lib/walqueue-queues")


def directives(filename: str) -> dict[str, str]:
    found = {}
    for line in (UNITS / filename).read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, value)
    return found


def expanded(value: str, instance: str = "NAME") -> str:
    """A unit's path as the system sees it (%S, %t for a system unit; %i the instance)."""
    return value.replace("%S", "/var/lib").replace("%t", "/run").replace("%i", instance)


def socket_argument(filename: str) -> str:
    command = directives(filename)["ExecStart"].split()
    return command[command.index("--socket") + 1] if "--socket" in command else command[1]


def test_the_plain_units_use_the_paths_the_module_names():
    service = directives("walqueued.service")
    assert f"/var/lib/{service['StateDirectory']}" == paths.PLAIN_QUEUE_DIRECTORY
    assert f"/run/{service['RuntimeDirectory']}" == paths.PLAIN_RUNTIME_DIRECTORY
    assert expanded(socket_argument("walqueued.service")) == paths.PLAIN_SOCKET
    assert expanded(directives("walqueued.socket")["ListenStream"]) == paths.PLAIN_SOCKET
    assert expanded(socket_argument("walqueue-worker.service")) == paths.PLAIN_SOCKET
    assert f"/var/lib/{directives('walqueue-worker.service')['StateDirectory']}" == paths.PLAIN_WORKER_DIRECTORY


def test_the_template_units_use_the_paths_the_module_names():
    service = directives("walqueued@.service")
    assert expanded(f"/var/lib/{service['StateDirectory']}") == paths.template_queue_directory("NAME")
    assert expanded(f"/run/{service['RuntimeDirectory']}") == paths.template_runtime_directory("NAME")
    for unit in ("walqueued@.service", "walqueue-worker@.service", "walqueue-scheduler@.service"):
        assert expanded(socket_argument(unit)) == paths.template_socket("NAME"), unit
    assert expanded(directives("walqueued@.socket")["ListenStream"]) == paths.template_socket("NAME")
    worker = directives("walqueue-worker@.service")
    assert expanded(f"/var/lib/{worker['StateDirectory']}") == paths.template_worker_directory("NAME")


def test_the_install_prefix_is_the_one_the_units_run():
    install = (REPO / "scripts" / "install").read_text()
    assert f"\nprefix={paths.INSTALL_PREFIX}\n" in install
    for unit in UNITS.glob("walqueue*.service"):
        assert directives(unit.name)["ExecStart"].startswith(f"{paths.CURRENT_INSTALL}/bin/"), unit.name


def wrong_paths(text: str) -> list[str]:
    """The paths in `text` that no unit uses (walqueue.paths), each as found."""
    plain_queue = paths.PLAIN_QUEUE_DIRECTORY.rsplit("/", 1)[1]
    known_roots = {path.rsplit("/", 1)[1] for path in (
        paths.PLAIN_QUEUE_DIRECTORY, paths.TEMPLATE_QUEUE_PARENT, paths.PLAIN_WORKER_DIRECTORY,
        paths.TEMPLATE_WORKER_PARENT)}
    wrong = []
    for found in PATH.findall(text):
        path = found.rstrip(".,:;")
        base = "/run" if path.startswith("/run/") else "/var/lib"
        root, *rest = path.removeprefix(base + "/").split("/")
        rest = [part for part in rest if part]
        root_name = root.split(".", 1)[0] if root.startswith(plain_queue + ".") else root
        if base == "/run":
            # The runtime directories hold the sockets, nothing else.
            if root == paths.PLAIN_RUNTIME_DIRECTORY.rsplit("/", 1)[1]:
                ok = rest in ([], [paths.SOCKET_NAME])
            elif root == paths.TEMPLATE_RUNTIME_PARENT.rsplit("/", 1)[1]:
                ok = len(rest) <= 1 or (len(rest) == 2 and rest[1] == paths.SOCKET_NAME)
            else:
                ok = False
        elif root_name == plain_queue:
            # The plain queue's directory holds its own files: no instance lives in it.
            ok = not rest or rest[0] not in INSTANCE_NAMES
        else:
            ok = root_name in known_roots or any(root.startswith(name + ".") for name in known_roots)
        if not ok:
            wrong.append(found)
    return wrong


def test_the_check_catches_the_old_template_layout():
    # The check itself can fail: each of these was once in a doc or a --help.
    for text in ("/run/walqueue/NAME/walqueued.sock", "/var/lib/walqueue/NAME",
                 "walqueue-worker /run/walqueue/orders/walqueued.sock x:y", "/var/lib/walqueue/orders.",
                 "/run/walqueue-queue/orders/walqueued.sock", "/var/lib/walqueues/orders"):
        assert wrong_paths(text), text
    assert wrong_paths("/var/lib/walqueue-queues/orders.before-restore-$(date +%s)") == []
    assert wrong_paths(f"{paths.template_socket('orders')}, {paths.PLAIN_SOCKET}.") == []


def outside_the_old_layout_note(relative: str, text: str) -> str:
    document, heading = OLD_LAYOUT_SECTION
    if relative != document:
        return text
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[:start] + (text[end:] if end != -1 else "")


def repository_texts() -> list[tuple[str, str]]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(UNITS.iterdir()),
             REPO / "scripts" / "install", REPO / "scripts" / "serve",
             *sorted((REPO / "src" / "walqueue").rglob("*.py"))]
    texts = []
    for file in files:
        relative = str(file.relative_to(REPO))
        texts.append((relative, outside_the_old_layout_note(relative, file.read_text())))
    return texts


@pytest.mark.parametrize("relative, text", repository_texts(), ids=[name for name, _ in repository_texts()])
def test_every_path_in_the_repository_is_one_the_units_use(relative, text):
    assert wrong_paths(text) == [], relative


def help_texts() -> list[tuple[str, str]]:
    runner = CliRunner()
    programs = [("walqueued", daemon_cli.cli), ("walqueue-ctl", ctl_cli),
                ("walqueue-worker", worker_cli.main), ("walqueue-scheduler", schedule_cli.main)]
    texts = []
    for name, command in programs:
        texts.append((name, runner.invoke(command, ["--help"]).output))
        if isinstance(command, click.Group):
            for sub in command.commands:
                texts.append((f"{name} {sub}", runner.invoke(command, [sub, "--help"]).output))
    return texts


def test_every_path_in_a_help_text_is_one_the_units_use():
    texts = help_texts()
    assert len(texts) > 20 and all(text for _, text in texts)
    assert any(paths.template_socket("orders") in text for _, text in texts)  # walqueue-worker's example
    assert {name: wrong_paths(text) for name, text in texts if wrong_paths(text)} == {}


def test_verify_names_the_template_queue_directory_in_its_next_hint(tmp_path):
    parent = tmp_path / "walqueue-queues"
    (parent / "orders").mkdir(parents=True)
    (parent / "orders" / "LOCK").touch()
    rendered = verify_directory(str(parent)).render()
    assert "NO QUEUE" in rendered and "orders/ holds a queue" in rendered
    assert f"{paths.template_queue_directory('NAME')} for walqueued@NAME" in rendered
    assert wrong_paths(rendered.replace(str(tmp_path), "")) == []


def markdown_rows(document: str) -> list[list[str]]:
    return [[cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
            for line in (REPO / "docs" / document).read_text().splitlines() if line.startswith("| ")]


def test_the_path_tables_of_the_docs_say_what_the_module_says():
    rows = {row[0]: row[1:] for row in markdown_rows("operations.md") if len(row) == 3}
    assert rows["queue directory (`StateDirectory=`)"] == [
        paths.PLAIN_QUEUE_DIRECTORY, paths.template_queue_directory("NAME")]
    assert rows["socket (`ListenStream=`, `--socket`)"] == [paths.PLAIN_SOCKET, paths.template_socket("NAME")]
    workers = {row[0]: row for row in markdown_rows("daemon.md") if row[0].startswith("walqueue-worker")}
    plain, template = workers["walqueue-worker.service"], workers["walqueue-worker@NAME.service"]
    assert (plain[2], plain[4]) == (paths.PLAIN_SOCKET, paths.PLAIN_WORKER_DIRECTORY)
    assert (template[2], template[4]) == (paths.template_socket("NAME"), paths.template_worker_directory("NAME"))
    assert plain[3] == f"{paths.CONFIGURATION_DIRECTORY}/worker.env"
    assert template[3] == f"{paths.CONFIGURATION_DIRECTORY}/worker-NAME.env"
