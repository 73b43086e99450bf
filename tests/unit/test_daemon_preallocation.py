"""`walqueued serve --preallocate-wal-bytes N`: the step reaches Queue at open and at the reopen.

The reopen after a failed write is the easy one to forget: a daemon that
preallocated at start and appended after its first ENOSPC would still work,
just slower, and nothing else would notice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from walqueue import Queue
from walqueue.daemon import cli
from walqueue.daemon.loop import Loop, bind_listener
from walqueue.daemon.systemd import Notifier, open_reporting_progress


def _segment_size(directory: Path) -> int:
    (segment,) = sorted(directory.glob("wal-*.log"))
    return segment.stat().st_size


def test_the_option_defaults_to_off_and_is_passed_to_serve(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(cli, "serve_directory", lambda *args, **options: seen.append(options) or 0)
    runner = CliRunner()
    assert runner.invoke(cli.cli, ["serve", str(tmp_path)]).exit_code == 0
    assert runner.invoke(cli.cli, ["serve", str(tmp_path), "--preallocate-wal-bytes", "4194304"]).exit_code == 0
    # Off unless asked: a tear inside preallocated space needs an operator (docs/daemon.md).
    assert [options["preallocate_wal_bytes"] for options in seen] == [0, 4 * 1024 * 1024]


@pytest.mark.parametrize("value", ["-1", str(2**30 + 1), "lots"])
def test_a_bad_value_is_a_usage_error(tmp_path, value):
    result = CliRunner().invoke(cli.cli, ["serve", str(tmp_path), "--preallocate-wal-bytes", value])
    assert result.exit_code == 2
    assert "--preallocate-wal-bytes" in result.output


@pytest.mark.parametrize("step", [0, 8192])
def test_the_queue_opened_at_start_preallocates_in_the_given_step(tmp_path, step):
    queue = open_reporting_progress(str(tmp_path), None, Notifier({}), step)
    try:
        Queue.over(queue).put("a", {})
        size = _segment_size(tmp_path)
        assert size == (step or queue.stats().wal_bytes)
    finally:
        queue.close()


def test_the_queue_reopened_after_a_write_failure_preallocates_too(tmp_path):
    directory = tmp_path / "queue"
    path = str(tmp_path / "s.sock")
    listener = bind_listener(path, 0o600)
    queue = open_reporting_progress(str(directory), None, Notifier({}), 8192)
    instance = Loop(str(directory), queue, listener, socket_path=path, compact_wal_bytes=10**12,
                    max_connections=10, hook=None, notifier=Notifier({}), preallocate_wal_bytes=8192)
    try:
        instance.commit.reopen()
        assert instance.queue is not queue
        Queue.over(instance.queue).put("a", {})
        assert _segment_size(directory) == 8192
    finally:
        instance.queue.close()
        instance.close_without_serving()
        listener.close()
