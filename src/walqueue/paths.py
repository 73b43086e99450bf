"""Where the systemd units in systemd/ and scripts/install put things: the one
source for every such path the code prints (help texts, hints, defaults).

The units decide; this module repeats what they say, and
tests/unit/test_paths.py checks the units, the docs and every --help text
against it. Two layouts share a machine without meeting:

- the plain `walqueued.service` (one queue for the machine):
  queue directory /var/lib/walqueue, socket /run/walqueue/walqueued.sock;
- the template `walqueued@NAME.service` (one daemon per named queue):
  queue directory /var/lib/walqueue-queues/NAME, socket
  /run/walqueue-queues/NAME/walqueued.sock. Not under the plain queue's
  directory: an instance named like one of its files (CURRENT) would land
  among them.

The workers' units keep a writable directory for their handler apart from
both (StateDirectory=, owned by the unit's dynamic user).
"""

from __future__ import annotations

SOCKET_NAME = "walqueued.sock"

# walqueued.service: StateDirectory=walqueue, RuntimeDirectory=walqueue.
PLAIN_QUEUE_DIRECTORY = "/var/lib/walqueue"
PLAIN_RUNTIME_DIRECTORY = "/run/walqueue"
PLAIN_SOCKET = f"{PLAIN_RUNTIME_DIRECTORY}/{SOCKET_NAME}"

# walqueued@NAME.service: StateDirectory=walqueue-queues/%i, RuntimeDirectory=walqueue-queues/%i.
TEMPLATE_QUEUE_PARENT = "/var/lib/walqueue-queues"
TEMPLATE_RUNTIME_PARENT = "/run/walqueue-queues"

# walqueue-worker.service and walqueue-worker@NAME.service: the handler's own directory.
PLAIN_WORKER_DIRECTORY = "/var/lib/walqueue-worker"
TEMPLATE_WORKER_PARENT = "/var/lib/walqueue-workers"

# Settings the worker and scheduler units read.
CONFIGURATION_DIRECTORY = "/etc/walqueue"

# scripts/install: PREFIX/KEY per installed version, PREFIX/current the one in use.
INSTALL_PREFIX = "/opt/walqueue"
CURRENT_INSTALL = f"{INSTALL_PREFIX}/current"


def template_queue_directory(name: str) -> str:
    """walqueued@NAME's queue directory."""
    return f"{TEMPLATE_QUEUE_PARENT}/{name}"


def template_runtime_directory(name: str) -> str:
    """walqueued@NAME's runtime directory, which holds its socket."""
    return f"{TEMPLATE_RUNTIME_PARENT}/{name}"


def template_socket(name: str) -> str:
    """walqueued@NAME's socket."""
    return f"{template_runtime_directory(name)}/{SOCKET_NAME}"


def template_worker_directory(name: str) -> str:
    """walqueue-worker@NAME's writable directory (its working directory)."""
    return f"{TEMPLATE_WORKER_PARENT}/{name}"
