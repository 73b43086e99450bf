"""Leases expired, counted (issue 24: the overview plots expiries per second): the Engine counts
every lease its reaps expire, whether a reserve's reap or walqueued's timer (expire_due); the
daemon's report carries the count as ``expired_total`` from protocol version 7 on (an older peer
gets the bytes it always got), and the metrics endpoint as ``walqueue_leases_expired_total``.
"""

from __future__ import annotations

import pytest

from walqueue import Queue, metrics
from walqueue import protocol as p
from walqueue.protocol.conversions import daemon_stats_to_wire

from .test_loop import served  # noqa: F401 - the fixture


def test_every_reap_counts_the_leases_it_expires(tmp_path):
    with Queue(tmp_path / "q") as queue:
        engine = queue.engine
        for name in ("a", "b", "c"):
            queue.put(name, {}, max_attempts=1)
        queue.reserve("w", now=0, lease_seconds=5, limit=2)       # a, b until 5
        assert engine.expired_total == 0
        queue.reserve("w", now=5, lease_seconds=5, limit=1)       # its reap expires a and b, leases c
        assert engine.expired_total == 2
        assert engine.expire_due(now=9) == 0 and engine.expired_total == 2
        assert engine.expire_due(now=10) == 1 and engine.expired_total == 3   # c, by the timer's call


def test_the_reap_count_check_goes_red_when_a_reserves_reap_is_not_counted(tmp_path):
    from tests import broken_see
    with broken_see.active("reap_uncounted_in_reserve"), pytest.raises(AssertionError):
        test_every_reap_counts_the_leases_it_expires(tmp_path)


def test_the_report_carries_the_count_to_peers_of_version_7_only(served):  # noqa: F811
    loop, clock, connect = served
    client = connect(p.EXPIRY_REPORTING_VERSION)
    client.send(p.Put(id=1, task_id="job", payload={}), p.Reserve(id=2, worker="w", lease_seconds=5))
    client.answer(1)
    (lease,) = client.answer(2).leases
    clock.advance(lease.deadline - clock.wall + 0.5)
    loop.one_turn()   # the timer's reap
    assert loop.queue.get("job").status == "ready"
    client.send(p.DaemonStatsReq(id=3))
    assert client.answer(3).stats.expired_total == 1
    report = loop.report(int(clock.wall))
    assert "walqueue_leases_expired_total 1\n" in metrics.render_prometheus(report)
    older = connect(p.ERROR_CODE_VERSION)
    older.send(p.DaemonStatsReq(id=4))
    assert older.answer(4).stats.expired_total == 0            # version 6 does not carry it
    assert b"expired_total" not in p.encode(p.DaemonStatsOk(id=5, stats=daemon_stats_to_wire(report, 6)))
