"""`walqueued serve --preallocate-wal-bytes N`: the step reaches Queue at open and at the reopen.

The reopen after a failed write is the easy one to forget: a daemon that
preallocated at start and appended after its first ENOSPC would still work,
just slower, and nothing else would notice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from walqueue import server


def _segment_size(directory: Path) -> int:
    (segment,) = sorted(directory.glob("wal-*.log"))
    return segment.stat().st_size


def test_the_option_defaults_to_off_and_is_passed_to_serve(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(server, "_serve", lambda *args: seen.append(args) or 0)
    runner = CliRunner()
    assert runner.invoke(server.cli, ["serve", str(tmp_path)]).exit_code == 0
    assert runner.invoke(server.cli, ["serve", str(tmp_path), "--preallocate-wal-bytes", "4194304"]).exit_code == 0
    # Off unless asked: a tear inside preallocated space needs an operator (docs/daemon.md).
    assert [args[7] for args in seen] == [0, 4 * 1024 * 1024]  # _serve(..., preallocate_wal_bytes, metrics)


@pytest.mark.parametrize("value", ["-1", str(2**30 + 1), "lots"])
def test_a_bad_value_is_a_usage_error(tmp_path, value):
    result = CliRunner().invoke(server.cli, ["serve", str(tmp_path), "--preallocate-wal-bytes", value])
    assert result.exit_code == 2
    assert "--preallocate-wal-bytes" in result.output


@pytest.mark.parametrize("step", [0, 8192])
def test_the_queue_opened_at_start_preallocates_in_the_given_step(tmp_path, step):
    queue = server.open_reporting_progress(str(tmp_path), None, server.Notifier({}), step)
    try:
        queue.put("a", {})
        size = _segment_size(tmp_path)
        assert size == (step or queue.stats().wal_bytes)
    finally:
        queue.close()


def test_the_queue_reopened_after_a_write_failure_preallocates_too(tmp_path):
    directory = tmp_path / "queue"
    path = str(tmp_path / "s.sock")
    listener = server.bind_listener(path, 0o600)
    queue = server.open_reporting_progress(str(directory), None, server.Notifier({}), 8192)
    instance = server.Server(str(directory), queue, listener, socket_path=path, compact_wal_bytes=10**12,
                             max_connections=10, hook=None, notifier=server.Notifier({}),
                             preallocate_wal_bytes=8192)
    try:
        instance._reopen()
        assert instance.queue is not queue
        instance.queue.put("a", {})
        assert _segment_size(directory) == 8192
    finally:
        instance.queue.close()
        instance.selector.close()
        instance._wake_read.close()
        instance._wake_write.close()
        listener.close()
