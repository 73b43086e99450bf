"""walqueue-ctl: the operator's command line for walqueued (SPEC §8) and for
a queue on PostgreSQL (SPEC §9, `--dsn URL`).

A thin layer over a client: each command is one or a few calls of SPEC's
client methods, its output is data (JSON, one object per line) or a report
(`stats`, `dead`, `tasks`, `next`, `top` and `verify` print for a human
unless `--json`), and every failure maps to one documented exit code with a
message that says what to do next. `verify` is the exception: it talks to no
daemon and reads a directory offline through `walqueue.verify` (read-only; no
lock taken).

One output convention, on every command:

* `--json`: the output is JSON with SPEC's field names (a `TaskView` or a
  `Lease` is one object, a listing one object per line), and errors are one
  JSON object each on stderr: `{"code": N, "error": "Name", "message": "..."}`
  (plus `task_id`, `status`, `generation` for a stale lease and `line` for a
  line of stdin). Data commands (`put`, `reserve`, `get`, ...) print JSON
  anyway.
* For a human, every name (task id, key, worker, directory) and every
  message from the daemon goes through `walqueue.display`, so control, bidi
  and invisible characters are escaped; JSON keeps every value exact.

Modules, from the bottom up (pyproject.toml's import contract "ctl" keeps
this order):

* `errors`: the exit codes, `CtlError`, and the mapping of library and
  client exceptions to codes and messages; `top`: the live view, drawn from
  two DaemonStats samples (standard library only);
* `output`: JSON lines, tables, JSON input; `backends`: the context object
  `Ctl` and the one place a backend is chosen;
* `group`: the group, its options and `--json`, and `command(...)`, with
  which each command module registers its commands;
* the commands, none importing another: `tasks` (put, get, tasks, next,
  dead, revive; listings read in pages), `leases` (reserve, ack, release,
  touch, force-release), `steering` (cancel, workers), `admin` (stats,
  metrics, top, compact, pause, resume, backup), `offline` (verify),
  `migrate` (PostgreSQL) and `schedule` (a walqueue-scheduler file's next
  runs).

A new command is one more module beside them, imported below.
"""

from __future__ import annotations

from walqueue.ctl import (  # noqa: F401  (they register their commands)
    admin,
    leases,
    migrate,
    offline,
    schedule,
    steering,
    tasks,
)
from walqueue.ctl.group import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Console-script entry point (`walqueue-ctl`)."""
    # The program name fixes the completion variable: _WALQUEUE_CTL_COMPLETE.
    cli.main(prog_name="walqueue-ctl")
